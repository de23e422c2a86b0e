"""Real-kernel tests: each test gets two fresh network namespaces joined by a veth pair.

Names are unique (nlt-<pid>-<n>-s / -c) and torn down in the fixture's
finally; traffic only flows between them. Nothing is ever added to the
machine's own namespace (checked at the end of the session).
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from dataclasses import dataclass

import pytest

from netlimit.config.validate import load_string
from netlimit.kernel.compile import compile_config
from netlimit.kernel import reconcile

_seq = itertools.count()
REQUIRED = ("ip", "tc", "iptables-legacy", "ip6tables-legacy", "iptables-legacy-save", "ip6tables-legacy-save")


def _sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=check, timeout=30)


def require(*tools: str) -> None:
    missing = [t for t in tools if not shutil.which(t)]
    if missing:
        pytest.fail(f"required tool(s) missing: {', '.join(missing)} — install them "
                    "(apt-get install iproute2 iptables iperf3); these tests never skip", pytrace=False)


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


def _setup(t: Topo) -> None:
    _sh("ip", "netns", "add", t.srv)
    _sh("ip", "netns", "add", t.cli)
    _sh("ip", "link", "add", t.srv_if, "netns", t.srv, "type", "veth", "peer", "name", t.cli_if, "netns", t.cli)
    for ns, dev, a4, a6s in ((t.srv, t.srv_if, [t.srv4], [t.srv6]), (t.cli, t.cli_if, [t.cli4, t.cli4b],
                                                                       [t.cli6, t.cli6b])):
        _sh("ip", "-n", ns, "link", "set", "lo", "up")
        for a in a4:
            _sh("ip", "-n", ns, "addr", "add", f"{a}/24", "dev", dev)
        for a in a6s:
            _sh("ip", "-n", ns, "addr", "add", f"{a}/64", "dev", dev, "nodad")
        _sh("ip", "-n", ns, "link", "set", dev, "up")
    # the client must use the exact source address a test binds to
    t.cx("ping", "-c", "1", "-W", "2", t.srv4, check=False)


BACKENDS = ("restore", "python-iptables")


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    """Run the test once per iptables backend: the in-process reconcile calls and the
    CLI subprocesses both follow $NETLIMIT_BACKEND (tests without it use the default)."""
    monkeypatch.setenv("NETLIMIT_BACKEND", request.param)
    return request.param


@pytest.fixture
def topo():
    if os.geteuid() != 0:
        pytest.fail("netns tests need root (they create network namespaces)", pytrace=False)
    require(*REQUIRED)
    n = next(_seq)
    base = f"nlt-{os.getpid()}-{n}"
    t = Topo(srv=f"{base}-s", cli=f"{base}-c")
    try:
        _setup(t)
        yield t
    finally:
        for ns in (t.srv, t.cli):
            _sh("ip", "netns", "del", ns, check=False)


def _root_snapshot() -> str:
    parts = []
    for cmd in (["iptables-legacy-save"], ["ip6tables-legacy-save"], ["tc", "qdisc", "show"], ["ip", "-br", "link"]):
        if shutil.which(cmd[0]):
            parts.append(_sh(*cmd, check=False).stdout)
    return "\n".join(parts)


@pytest.fixture(scope="session", autouse=True)
def root_namespace_untouched():
    """Fail loudly if anything of netlimit's appears in the machine's own namespace."""
    yield
    if os.geteuid() != 0:
        return
    snap = _root_snapshot()
    for marker in ("netlimit", "NETLIMIT", "nlifb-", "4e4c:"):
        assert marker not in snap, f"{marker!r} found in the ROOT namespace:\n{snap}"
    leftovers = [n for n in _sh("ip", "netns", "list").stdout.split() if n.startswith(f"nlt-{os.getpid()}-")]
    assert not leftovers, f"namespaces left behind: {leftovers}"
