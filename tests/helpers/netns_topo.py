"""Two fresh network namespaces joined by a veth pair, for real-kernel tests.

Names are unique (nlt-<pid>-<n>-s / -c) and torn down in the fixture's
finally; traffic only flows between them. Nothing is ever added to the
machine's own namespace (checked at the end of the session).
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
from dataclasses import dataclass

import pytest

from netlimit.config.validate import load_string
from netlimit.kernel import reconcile
from netlimit.kernel.compile import compile_config

_seq = itertools.count()
REQUIRED = ("ip", "tc", "iptables-legacy", "ip6tables-legacy", "iptables-legacy-save", "ip6tables-legacy-save", "nft")


def _sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=check, timeout=30)


def require(*tools: str) -> None:
    missing = [t for t in tools if not shutil.which(t)]
    if missing:
        pytest.fail(
            f"required tool(s) missing: {', '.join(missing)} — install them "
            "(apt-get install iproute2 iptables nftables iperf3); these tests never skip",
            pytrace=False,
        )


@dataclass
class Topo:
    srv: str
    cli: str
    srv_if: str = "s0"
    cli_if: str = "c0"
    srv4: str = "198.18.0.1"
    cli4: str = "198.18.0.2"
    cli4b: str = "198.18.0.3"
    srv6: str = "2001:db8::1"
    cli6: str = "2001:db8::2"
    cli6b: str = "2001:db8::3"

    def sx(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        return _sh("ip", "netns", "exec", self.srv, *cmd, check=check)

    def cx(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        return _sh("ip", "netns", "exec", self.cli, *cmd, check=check)

    def desired(self, text: str):
        return compile_config(load_string(text, "<test>").config)

    def apply(self, text: str):
        return reconcile.apply(self.desired(text), self.srv)

    def state(self):
        return reconcile.read_owned(self.srv)

    def permanent_neighbours(self) -> None:
        """Static neighbour entries both ways for the topology's own addresses (ARP and
        IPv6): no neighbour discovery between them. A ban or deny of an IPv6 client drops its ICMPv6
        too, so a neighbour probe from it (on a busy host, once an entry went stale
        during a test) was one more drop than the packets a test sent: 41 of 40, 43 of 40
        under the heavy soak."""
        smac = self.sx("cat", f"/sys/class/net/{self.srv_if}/address").stdout.strip()
        cmac = self.cx("cat", f"/sys/class/net/{self.cli_if}/address").stdout.strip()
        for a in (self.cli4, self.cli4b, self.cli6, self.cli6b):
            self.sx("ip", "neigh", "replace", a, "lladdr", cmac, "dev", self.srv_if, "nud", "permanent")
        for a in (self.srv4, self.srv6):
            self.cx("ip", "neigh", "replace", a, "lladdr", smac, "dev", self.cli_if, "nud", "permanent")


def _setup(t: Topo) -> None:
    _sh("ip", "netns", "add", t.srv)
    _sh("ip", "netns", "add", t.cli)
    _sh("ip", "link", "add", t.srv_if, "netns", t.srv, "type", "veth", "peer", "name", t.cli_if, "netns", t.cli)
    for ns, dev, a4, a6s in (
        (t.srv, t.srv_if, [t.srv4], [t.srv6]),
        (t.cli, t.cli_if, [t.cli4, t.cli4b], [t.cli6, t.cli6b]),
    ):
        _sh("ip", "-n", ns, "link", "set", "lo", "up")
        for a in a4:
            _sh("ip", "-n", ns, "addr", "add", f"{a}/24", "dev", dev)
        for a in a6s:
            _sh("ip", "-n", ns, "addr", "add", f"{a}/64", "dev", dev, "nodad")
        _sh("ip", "-n", ns, "link", "set", dev, "up")
    # the client must use the exact source address a test binds to
    t.cx("ping", "-c", "1", "-W", "2", t.srv4, check=False)
    t.permanent_neighbours()
