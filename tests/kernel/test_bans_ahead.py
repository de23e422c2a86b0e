"""The ban sets read ahead of a start's first write (issue 35: netlimitd dumps the sets
beside its first apply and the list's read, and writes only the difference when the list
arrives): the read stands only while no commit was made since (the ruleset's generation),
else the sync reads the sets again; either way the sets end holding exactly the list."""

from __future__ import annotations

import ipaddress
import subprocess
import time

import pytest

from netlimit.kernel.banset import ban_sets, held_ahead, xdp_mirror
from netlimit.kernel.netns import run_in_netns
from netlimit.kernel.nft import bansets as nftbansets

pytestmark = pytest.mark.netns
N = ipaddress.ip_network

CONFIG = """
version: 1
bans: {max_entries: 1000}
network:
  - name: udp-flood
    protocol: udp
    ports: [5000]
    limit: 100/second
"""

BANS = {
    N("10.0.0.0/24"): 600.0,
    N("10.0.1.7/32"): 500.0,
    N("2001:db8::/64"): 600.0,
}


def prefixes(bans: dict, less: float = 0.0) -> list[tuple[int, int, int, float]]:
    return sorted((n.version, int(n.network_address), n.prefixlen, left - less) for n, left in bans.items())


def held(topo) -> dict:
    return run_in_netns(topo.srv, lambda: ban_sets("nftables").read()) or {}


def test_a_read_ahead_is_used_while_nothing_was_committed_since(topo):
    topo.apply(CONFIG)
    s = ban_sets("nftables")
    run_in_netns(topo.srv, lambda: s.replace(BANS))
    ahead = run_in_netns(topo.srv, lambda: held_ahead(s))
    assert isinstance(ahead, nftbansets.Held) and ahead.sets is not None
    assert {k: len(v) for k, v in ahead.sets.items()} == {4: 2, 6: 1}
    time.sleep(1.0)  # the times left went on: the read's age is counted, nothing is rewritten
    want = {**BANS, N("10.0.2.0/24"): 300.0}
    done = run_in_netns(topo.srv, lambda: s.sync_prefixes(prefixes(want, 1.0), held=ahead))
    assert (done["write"], done["held_from"], done["added"], done["removed"]) == ("diff", "prefetch", 1, 0), done
    assert set(held(topo)) == set(want)
    # the read ahead through the XDP mirror (a file with `xdp:`): the same, no program loaded
    m = xdp_mirror(s, topo.srv)
    ahead = run_in_netns(topo.srv, lambda: held_ahead(m))
    done = run_in_netns(topo.srv, lambda: m.sync_prefixes(prefixes(BANS, 1.0), ahead))
    assert (done["write"], done["held_from"], done["removed"]) == ("diff", "prefetch", 1), done
    assert set(held(topo)) == set(BANS)


@pytest.mark.parametrize("change", ["add", "flush", "recreate"])
def test_a_read_ahead_is_not_used_after_a_commit(topo, change):
    """Whatever changed the sets after the read (an element added or flushed by another
    tool, the set made anew by an apply): the sync reads them again and writes exactly
    the list."""
    topo.apply(CONFIG)
    s = ban_sets("nftables")
    run_in_netns(topo.srv, lambda: s.replace(BANS))
    ahead = run_in_netns(topo.srv, lambda: held_ahead(s))
    nft = ["ip", "netns", "exec", topo.srv, "nft"]
    if change == "add":
        cmd = [*nft, "add", "element", "inet", "netlimit", "bans4", "{ 10.9.0.0/24 timeout 1h }"]
    elif change == "flush":
        cmd = [*nft, "flush", "set", "inet", "netlimit", "bans4"]
    else:
        cmd = [*nft, "delete", "table", "inet", "netlimit"]
    subprocess.run(cmd, check=True, capture_output=True)
    if change == "recreate":
        topo.apply(CONFIG)  # the apply makes the set again, empty
    done = run_in_netns(topo.srv, lambda: s.sync_prefixes(prefixes(BANS), held=ahead))
    assert done["held_from"] == "dump", done
    assert set(held(topo)) == set(BANS)


def test_a_read_ahead_of_missing_sets_is_not_used_once_they_exist(topo):
    """A cold start: the read finds no table (the first apply makes it); the sync after
    the apply reads the new, empty sets and writes the list whole."""
    s = ban_sets("nftables")
    ahead = run_in_netns(topo.srv, lambda: held_ahead(s))
    assert isinstance(ahead, nftbansets.Held) and ahead.sets is None
    topo.apply(CONFIG)
    done = run_in_netns(topo.srv, lambda: s.sync_prefixes(prefixes(BANS), held=ahead))
    assert (done["write"], done["held_from"], done.get("why")) == ("whole", "dump", "empty"), done
    assert set(held(topo)) == set(BANS)


def test_held_prefixes_in_the_kernels_order_is_what_read_says(topo, monkeypatch):
    """held_prefixes() pairs the elements in the order the kernel dumps them (one pass,
    no sorting) for a set of 3,000 prefixes, many of them adjacent; the same as read()."""
    import random

    from netlimit.kernel.nft import elements as nfelements

    topo.apply(CONFIG)
    rnd = random.Random(5)
    bans: dict = {}
    a = 0x0A000000
    while len(bans) < 3000:
        plen = rnd.choice([32, 30, 28, 24])
        a = (a + rnd.choice([0, 0, 1, 300]) * (1 << (32 - plen)) + (1 << (32 - plen)) - 1) >> (32 - plen) << (32 - plen)
        bans[N((a, plen))] = float(rnd.randrange(100, 3000))
        a += 1 << (32 - plen)
    # into the interval set itself, single addresses too (netlimit writes those to the
    # hash set; the pairing is the interval set's, and adjacent /32s are its hardest case)
    run_in_netns(
        topo.srv, lambda: nfelements.write([nfelements.Change("netlimit", "bans4", True, flush=True, add=bans)])
    )
    in_order = []
    pair = nfelements._pair_in_order
    monkeypatch.setattr(nfelements, "_pair_in_order", lambda *a: in_order.append(pair(*a)) or in_order[-1])
    got = run_in_netns(topo.srv, lambda: nfelements.held_prefixes("netlimit", "bans4", 4))
    assert in_order and in_order[0] is not None  # the one pass was enough
    read = run_in_netns(topo.srv, lambda: nfelements.prefixes(nfelements.read("netlimit", "bans4") or [], True))
    assert {N(k) for k in got} == set(read) == set(bans)
    assert all(abs(got[(int(n.network_address), n.prefixlen)] / 1000 - left) < 5 for n, left in read.items() if left)
