"""Fixtures for the XDP drop path: the `topo` namespaces (tests/conftest.py) with
netlimit's XDP program on the server's veth, always detached and unpinned in finally."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from netlimit.kernel.xdp import XdpPath, leftovers


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=check, timeout=30)


@pytest.fixture
def xdp(topo):
    """An XdpPath for the server namespace, loaded; flushed (detach + unpin) in finally."""
    for tool in ("clang", "iptables-legacy"):
        if not shutil.which(tool):
            pytest.fail(f"{tool} missing: run scripts/setup.sh (apt-get install clang llvm libbpf-dev)", pytrace=False)
    # the topology's neighbours are permanent (netns_topo): a ban on a source also drops
    # its neighbour solicitations, which must not starve the other flows
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
