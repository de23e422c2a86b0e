"""The Vagrant scenario (vagrant/scenario.py), run against network namespaces.

Same scenario, same checks, same limiter.yaml as the VM run (vagrant/run.sh);
only the hosts differ: three namespaces (limiter, client, flood) whose eth1
sit on a bridge in a fourth, netlimitd + the sidecar + the upstream app in the
limiter's namespace via `ip netns exec`. Unique names (nlsc-<pid>-<n>-...),
everything removed in a finally, nothing added to the machine's own namespace
(checked), every flood bounded (4 s, a few thousand packets).
"""

from __future__ import annotations

import io
import itertools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from vagrant_scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]
_seq = itertools.count()


class _Tee(io.StringIO):
    def write(self, s):
        sys.stdout.write(s)
        return super().write(s)


def _root_snapshot() -> str:
    """The machine's own rules, qdiscs and links (without counters and timestamps)."""
    parts = []
    for cmd in (["iptables-legacy-save"], ["ip6tables-legacy-save"], ["tc", "qdisc", "show"], ["ip", "-br", "link"]):
        if shutil.which(cmd[0]):
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
            parts += [re.sub(r"\[\d+:\d+\]", "", ln) for ln in out.splitlines() if not ln.startswith("#")]
    return "\n".join(parts)


def _names_files() -> set[str]:
    try:
        return set(os.listdir("/run/netlimit"))
    except OSError:
        return set()


def test_limiter_yaml_is_what_the_scenario_measures():
    """No root: the shipped limiter.yaml is valid netlimit and the scenario reads every number from it."""
    from netlimit.config.validate import load_file

    sc = load_scenario()
    path = ROOT / "vagrant" / "limiter.yaml"
    load_file(path)  # raises ConfigError with file:line:col
    text = path.read_text()
    lim = sc.Limits.from_yaml(text)
    assert (lim.udp_port, lim.udp_rate, lim.udp_burst) == (5000, 50.0, 25)
    assert (lim.syn_port, lim.syn_rate, lim.syn_burst) == (5001, 20.0, 10)
    assert (lim.bw_port, lim.bw_rate, lim.bw_iface) == (5201, 4e6, "eth1")
    assert (lim.http_limit, lim.http_period) == (10, 60)
    edited = lim.with_udp_limit(100, text)
    diff = [(a, b) for a, b in zip(text.splitlines(), edited.splitlines()) if a != b]
    assert len(diff) == 1 and "100/second" in diff[0][1]  # an operator's one-line edit
    assert sc.Limits.from_yaml(edited).udp_rate == 100.0
    assert sc.Limits.from_yaml(edited).syn_rate == 20.0


@pytest.mark.netns
def test_scenario_in_namespaces():
    if os.geteuid() != 0:
        pytest.fail("the scenario needs root (it creates network namespaces)", pytrace=False)
    missing = [t for t in ("ip", "iptables-legacy", "iptables-legacy-save", "tc") if not shutil.which(t)]
    if missing:
        pytest.fail(f"missing: {', '.join(missing)} (apt-get install iproute2 iptables)", pytrace=False)
    sc = load_scenario()
    prefix = f"nlsc-{os.getpid()}-{next(_seq)}"
    root_before, names_before = _root_snapshot(), _names_files()
    params = sc.Params(flood_seconds=4.0, bulk_seconds=5.0)
    out = _Tee()
    lab = sc.NetnsLab(prefix=prefix)
    try:
        lab.up((ROOT / "vagrant" / "limiter.yaml").read_text())
        ok = sc.Scenario(lab.hosts(), lab.deployment(), sc.NETNS_TOLERANCE, params, out=out).run()
        lab.check_alive()
    finally:
        inodes = {str(os.stat(f"/run/netns/{n}").st_ino) for n in lab.ns.values() if os.path.exists(f"/run/netns/{n}")}
        lab.close()
    text = out.getvalue()
    assert ok, f"the scenario missed:\n{text}"
    layers = {"L3", "L4", "L7", "bandwidth", "reload", "xdp"}
    assert layers <= {line.split()[0] for line in text.splitlines() if line.split()}
    assert "MISS" not in text
    left = [
        n
        for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
        if n.startswith(prefix)
    ]
    assert not left, f"namespaces left behind: {left}"
    assert not Path(lab.work).exists()
    assert _root_snapshot() == root_before, "the scenario changed the machine's own namespace"
    # other tests running beside this one on a shared machine write their own namespaces'
    # notes there (rules-<their netns>.json, nft-<their netns inode>.json): a new file is
    # this scenario's leak when it names one of its namespaces or the machine's own
    new = _names_files() - names_before
    ours = [f for f in new if prefix in f or "_root" in f or any(f"-{i}." in f for i in inodes)]
    assert not ours, f"netlimitd wrote into the machine's /run/netlimit: {ours}"
