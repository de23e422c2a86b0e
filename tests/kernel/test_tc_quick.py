"""tc's quick look (kernel/tc/quick.py): read_state without pyroute2 when nothing of
ours is in tc, and the same TcState as the full read through pyroute2 in every case
(nothing, a foreign root qdisc, our root qdisc, an ingress qdisc, an nlifb-* link)."""

from __future__ import annotations

import subprocess

import pytest
from lone_netns import LoneNetns

from netlimit.kernel.netns import run_in_netns
from netlimit.kernel.tc import shaping
from netlimit.kernel.tc.quick import look


def _both(ns: str):
    def work():
        seen = look(shaping.IFB_PREFIX, shaping.ROOT, shaping.TC_H_INGRESS, shaping.TC_H_ROOT)
        return seen, shaping.read_state(), shaping.read_state(shaping._ipr())

    return run_in_netns(ns, work)


def _sh(ns: str, cmd: str) -> None:
    subprocess.run(["ip", "netns", "exec", ns, "sh", "-ec", cmd], check=True, capture_output=True)


@pytest.mark.parametrize(
    ("setup", "quick"),
    [
        ("true", True),
        ("tc qdisc add dev q0 root handle 1: htb", True),  # foreign: refused by apply, seen here
        ("tc qdisc add dev q0 root handle 4e4c: htb", False),  # ours: the full read
        ("tc qdisc add dev q1 ingress", False),
        ("ip link add nlifb-q type ifb", False),
    ],
)
def test_quick_look_agrees_with_the_full_read(setup, quick):
    with LoneNetns("tcq") as ns:
        _sh(ns.name, "ip link add q0 type veth peer name q1")
        _sh(ns.name, setup)
        seen, fast, full = _both(ns.name)
        assert (seen is not None) is quick
        assert fast == full
        assert set(full.ifindex) >= {"lo", "q0", "q1"}
        if "1: htb" in setup:
            assert full.foreign_roots == {"q0": "htb 1:"}
