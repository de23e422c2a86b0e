"""netlimitd as a real process for the tests (tests/daemon): its config, its
status socket, and what netlimit owns in a namespace, read with the real tools."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

EXE = str(Path(sys.executable).with_name("netlimit"))
#: netlimitd as systemd starts it (daemon/main.py: no typer), from this tree
NETLIMITD = [sys.executable, "-m", "netlimit.daemon"]

BASE = """\
version: 1
on_stop: {on_stop}
exempt: [127.0.0.0/8]
network:
  - name: udp-flood
    protocol: udp
    ports: [5000]
    limit: 100/second
    burst: 10
{extra}bandwidth:
  - name: shape
    interface: nlta
    rate: 10mbit
"""


def config_text(on_stop: str = "flush", extra: str = "") -> str:
    return BASE.format(on_stop=on_stop, extra=extra)


EXTRA_RULE = """\
  - name: ssh-guard
    protocol: tcp
    ports: [22]
    new_connections: true
    limit: 3/minute
    method: recent
"""


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=check)


def owned_rules(ns: str) -> list[str]:
    """netlimit's rules in the legacy tables and in table inet netlimit, counters left out."""
    out = sh("ip", "netns", "exec", ns, "iptables-legacy-save").stdout
    out += sh("ip", "netns", "exec", ns, "ip6tables-legacy-save").stdout
    rules = [line for line in out.splitlines() if "netlimit" in line and line.startswith("-A")]
    nft = sh("ip", "netns", "exec", ns, "nft", "list", "table", "inet", "netlimit", check=False).stdout
    for line in nft.splitlines():
        line = re.sub(r"counter packets \d+ bytes \d+", "counter", line.strip())
        if 'comment "netlimit:' in line and not line.startswith(("set ", "comment ")):
            rules.append(line)
    return rules


def qdiscs(ns: str) -> str:
    return sh("ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev", "nlta").stdout


def wait_for(pred, timeout: float, what: str, step: float = 0.1):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    def __init__(
        self, tmp: Path, ns: str, text: str, resync: float = 1.0, env: dict | None = None, netlimitd: bool = False
    ):
        self.tmp, self.ns = tmp, ns
        self.cmd = NETLIMITD if netlimitd else [EXE, "daemon"]  # `netlimitd ...` or `netlimit daemon ...`
        self.config = tmp / "netlimit.yaml"
        self.config.write_text(text)
        self.sock = str(tmp / "netlimitd.sock")
        self.metrics_port = free_port()
        self.log = tmp / "daemon.log"
        self.resync = resync
        self.env = env
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                *self.cmd,
                "--config",
                str(self.config),
                "--netns",
                self.ns,
                "--resync",
                str(self.resync),
                "--socket",
                self.sock,
                "--metrics",
                f"127.0.0.1:{self.metrics_port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(self.log, "a"),
            env=self.env or os.environ.copy(),
        )
        from netlimit.daemon import query_status

        def answered():
            if self.proc.poll() is not None:
                return True
            try:
                st = query_status(self.sock, timeout=1)
            except OSError:
                return False
            return st is not None and st.get("pid") == self.proc.pid

        wait_for(answered, 30, "the daemon's status socket")
        assert self.proc.poll() is None, self.log.read_text()

    def status(self) -> dict:
        out = subprocess.run(
            [EXE, "status", "--json", "--socket", self.sock], capture_output=True, text=True, timeout=30
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def edit(self, text: str) -> None:
        """As an editor does: write a new file, rename it over the old one."""
        new = self.config.with_suffix(".new")
        new.write_text(text)
        os.replace(new, self.config)

    def stop(self, sig=signal.SIGTERM, timeout: float = 30) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            # netlimitd writes every thread's stack on SIGUSR1 (faulthandler): where it hangs
            size = self.log.stat().st_size
            self.proc.send_signal(signal.SIGUSR1)
            deadline = time.monotonic() + 5
            while self.log.stat().st_size == size and time.monotonic() < deadline:
                time.sleep(0.1)
            raise AssertionError(
                f"the daemon did not stop within {timeout} s of {signal.Signals(sig).name}; its threads:\n"
                + self.log.read_text()[size:][-8000:]
            ) from None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
