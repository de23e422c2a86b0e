"""Protected.drop_sorted (a restart's whole list checked against the exempt networks and
trusted proxies by bisection, issue 35) drops exactly what allows() refuses."""

from __future__ import annotations

import ipaddress

from hypothesis import given, settings
from hypothesis import strategies as st

from netlimit.bans.model import Protected


def prefix(version: int):
    bits = 32 if version == 4 else 128
    base = 0x0A000000 if version == 4 else 0x20010DB8 << 96
    span = 12  # all of them within 2**12 addresses at the bottom: overlaps are common

    def make(off_plen):
        off, plen = off_plen
        plen = max(plen, bits - span)
        a = (base + off) >> (bits - plen) << (bits - plen)
        return ipaddress.ip_network((a, plen)) if version == 4 else ipaddress.IPv6Network((a, plen))

    return st.tuples(st.integers(0, (1 << span) - 1), st.integers(0, bits)).map(make)


nets = st.one_of(prefix(4), prefix(6))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(nets, max_size=60, unique=True),
    st.lists(nets, max_size=3),
    st.lists(nets, max_size=3),
)
def test_drop_sorted_is_allows_for_each(bans, exempt, proxies):
    p = Protected(exempt, proxies)
    items = sorted((n.version, int(n.network_address), n.prefixlen, 60.0) for n in bans)
    want = [it for it in items if p.allows(it[0], it[1], it[1] + (1 << ((32 if it[0] == 4 else 128) - it[2])) - 1)]
    assert p.drop_sorted(items) == want
    for it in items:  # allows() is reason() on integers
        net = ipaddress.ip_network((it[1], it[2])) if it[0] == 4 else ipaddress.IPv6Network((it[1], it[2]))
        assert (it in want) == (p.reason(net) is None)


def test_nothing_protected_returns_the_list_itself():
    items = [(4, 1, 32, 1.0)]
    assert Protected([], []).drop_sorted(items) is items
