"""`netlimit demo` end to end: configured vs measured, and clean-up on Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.netns

CMD = [sys.executable, "-m", "netlimit.cli", "demo"]


def _demo_namespaces(pid: int) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(f"nldemo-{pid}-")]


def test_demo_runs_and_cleans_up():
    if os.geteuid() != 0:
        pytest.fail("the demo needs root", pytrace=False)
    t0 = time.monotonic()
    p = subprocess.Popen(CMD, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, errout = p.communicate(timeout=120)
    took = time.monotonic() - t0
    print(out)
    assert p.returncode == 0, out + errout
    for rule in ("udp-flood", "(exempt)", "new-conns", "max-conns", "bulk-out", "uploads-in", "escalate"):
        assert rule in out
    assert "all within tolerance" in out and "MISS" not in out
    # one escalation end to end: 10 HTTP denials, then the client's packets dropped by the kernel
    assert "10 denials in 10 s -> banned at L3 for 1m" in out and "0 of 20 packets delivered" in out
    assert "backend: nftables (auto: this host's iptables is the nf_tables variant" in out  # Debian 12
    assert "[demo]" in errout  # the progress line
    assert took < 60
    assert _demo_namespaces(p.pid) == []


def test_demo_interrupted_tears_down():
    if os.geteuid() != 0:
        pytest.fail("the demo needs root", pytrace=False)
    p = subprocess.Popen(CMD, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while not _demo_namespaces(p.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _demo_namespaces(p.pid), "the demo did not create its namespaces"
    time.sleep(1.5)  # traffic is running now
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=60)
    assert p.returncode != 0
    assert "interrupted" in out
    assert _demo_namespaces(p.pid) == []
