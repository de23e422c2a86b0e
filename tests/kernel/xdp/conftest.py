"""Fixtures for the XDP drop path: the `topo` namespaces (tests/conftest.py) with
netlimit's XDP program on the server's veth, always detached and unpinned in finally."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from netlimit.kernel.xdp import XdpPath, leftovers


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=check, timeout=30)


def _mac(ns: str, dev: str) -> str:
    out = sh("ip", "-n", ns, "-o", "link", "show", dev).stdout
    m = re.search(r"link/ether ([0-9a-f:]{17})", out)
    assert m, out
    return m.group(1)


def pin_neighbours(topo) -> None:
    """Permanent neighbour entries both ways: a ban on a source also drops that
    source's neighbour solicitations, which must not starve the other flows."""
    smac, cmac = _mac(topo.srv, topo.srv_if), _mac(topo.cli, topo.cli_if)
    for addr in (topo.srv4, topo.srv6):
        sh("ip", "-n", topo.cli, "neigh", "replace", addr, "lladdr", smac, "dev", topo.cli_if, "nud", "permanent")
    for addr in (topo.cli4, topo.cli4b, topo.cli6, topo.cli6b):
        sh("ip", "-n", topo.srv, "neigh", "replace", addr, "lladdr", cmac, "dev", topo.srv_if, "nud", "permanent")


@pytest.fixture
def xdp(topo):
    """An XdpPath for the server namespace, loaded; flushed (detach + unpin) in finally."""
    for tool in ("clang", "iptables-legacy"):
        if not shutil.which(tool):
            pytest.fail(f"{tool} missing: run scripts/setup.sh (apt-get install clang llvm libbpf-dev)", pytrace=False)
    pin_neighbours(topo)
    path = XdpPath(topo.srv)
    try:
        path.load()
        yield path
    finally:
        try:
            path.flush()
        finally:
            path.close()
        assert not os.path.exists(path.pin_dir), f"{path.pin_dir} left pinned"


@pytest.fixture(scope="session", autouse=True)
def nothing_left_pinned():
    """After the XDP tests /sys/fs/bpf/netlimit holds nothing of ours.  Only ours: another
    run on the same machine (a second checkout's tests) pins under its own namespaces'
    names, and its pins are its own to remove (the before-stop check looks at all)."""
    yield
    mine = [p for p in leftovers() if f"/ns-nlt-{os.getpid()}-" in p]
    assert not mine, f"left pinned: {mine}"
