"""/run/netlimit keeps small notes per namespace (the nftables record of what was
written, tc rule names and the applied rules for `list`); `ip netns del` leaves them behind and the next
`netlimit flush` (of any namespace) removes them, keeping those of live namespaces."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from netns_topo import _sh

pytestmark = pytest.mark.netns
NETLIMIT = [sys.executable, "-m", "netlimit.cli"]
STATE = "/run/netlimit"

FILE = """
version: 1
network:
  - name: udp-cap
    protocol: udp
    ports: [5000]
    limit: 100/second
bandwidth:
  - name: bulk
    interface: {dev}
    rate: 10mbit
    ports: [8080]
"""


def notes(ns: str, inode: int) -> set[str]:
    want = {f"tc-names-{ns}.json", f"rules-{ns}.json", f"nft-{inode}.json", f"nft-{inode}.json.prev"}
    return want & set(os.listdir(STATE))


def apply(topo, ns: str, dev: str, tmp_path) -> int:
    f = tmp_path / f"{ns}.yaml"
    f.write_text(FILE.format(dev=dev))
    p = subprocess.run(
        [*NETLIMIT, "apply", str(f), "--netns", ns, "--backend", "nftables", "-q"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    return os.stat(f"/run/netns/{ns}").st_ino


def test_flush_removes_the_notes_of_deleted_namespaces(topo, tmp_path):
    other = f"{topo.srv}x"  # a third namespace, alive throughout
    _sh("ip", "netns", "add", other)
    try:
        _sh("ip", "-n", other, "link", "add", "d0", "type", "veth", "peer", "name", "d1")
        _sh("ip", "-n", other, "link", "set", "d0", "up")
        alive = apply(topo, other, "d0", tmp_path)
        gone = apply(topo, topo.srv, topo.srv_if, tmp_path)
        apply(topo, topo.cli, topo.cli_if, tmp_path)
        assert {f"tc-names-{topo.srv}.json", f"rules-{topo.srv}.json", f"nft-{gone}.json"} <= notes(topo.srv, gone)
        before_alive = notes(other, alive)
        assert {f"tc-names-{other}.json", f"rules-{other}.json", f"nft-{alive}.json"} <= before_alive
        _sh("ip", "netns", "del", topo.srv)
        assert notes(topo.srv, gone)  # left behind by `ip netns del`
        p = subprocess.run(
            [*NETLIMIT, "flush", "--netns", topo.cli, "--backend", "nftables"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert p.returncode == 0, p.stderr
        assert notes(topo.srv, gone) == set()
        assert notes(other, alive) == before_alive  # a live namespace keeps its notes
        assert f"tc-names-{topo.cli}.json" not in os.listdir(STATE)  # the flushed one: nothing left to name
    finally:
        subprocess.run([*NETLIMIT, "flush", "--netns", other, "-q"], capture_output=True, timeout=120)
        _sh("ip", "netns", "del", other, check=False)
