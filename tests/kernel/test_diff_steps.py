"""kernel/nft/bansets.diff_steps, the pure part of writing a large difference in steps:
on a model of the sets, every cut it makes keeps each ban the list shares with what
the sets held, never holds two overlapping intervals (the kernel refuses them), only
ever holds the list's bans and the dropped ones, and ends holding the list."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from netlimit.kernel.nft.bansets import _difference, diff_steps


def _span(v: int, a: int, p: int) -> tuple[int, int]:
    bits = 32 if v == 4 else 128
    return a, a + (1 << (bits - p))


def _disjoint(prefixes: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """Drop every prefix that overlaps one kept before it (the list and the held sets are
    each made of prefixes none of which holds another)."""
    out: list[tuple[int, int, int]] = []
    for v, a, p in prefixes:
        lo, hi = _span(v, a, p)
        if all(w != v or _span(w, b, q)[1] <= lo or hi <= _span(w, b, q)[0] for w, b, q in out):
            out.append((v, a, p))
    return out


# small address spaces (10.0.x.y, 2001:db8::/120) so that prefixes overlap often
_V4 = st.tuples(st.just(4), st.integers(0, 1023), st.sampled_from([22, 24, 26, 28, 30, 32]))
_V6 = st.tuples(st.just(6), st.integers(0, 255), st.sampled_from([120, 124, 126, 128]))


def _prefix(t: tuple[int, int, int]) -> tuple[int, int, int]:
    v, x, p = t
    bits = 32 if v == 4 else 128
    a = (10 << 24) + (x << 2) if v == 4 else (0x20010DB8 << 96) + x  # 10.0.0.0/20, 2001:db8::/120
    return v, a & ~((1 << (bits - p)) - 1), p


@settings(max_examples=300, deadline=None)
@given(
    held=st.lists(st.one_of(_V4, _V6), max_size=40),
    wanted=st.lists(st.one_of(_V4, _V6), max_size=40),
    times=st.lists(st.sampled_from([100.0, 3000.0]), min_size=80, max_size=80),
    step=st.integers(1, 7),
)
def test_every_step_keeps_the_shared_bans_and_never_overlaps(held, wanted, times, step):
    h = _disjoint([_prefix(t) for t in held])
    w = sorted(_disjoint([_prefix(t) for t in wanted]))
    found: dict[int, dict[tuple[int, int], int]] = {4: {}, 6: {}}
    for i, (v, a, p) in enumerate(h):
        found[v][(a, p)] = int(times[i] * 1000)  # 100 s or 3000 s left
    prefixes = [(v, a, p, 3000.0) for v, a, p in w]  # the list wants 3000 s: the 100 s ones are written anew
    add_t, remove_t = _difference(prefixes, found, 0.0)
    steps = diff_steps(add_t, remove_t, step)
    state = set(h)
    shared = set(h) & set(w)
    for adds, removes in steps:
        assert adds or removes
        for r in removes:
            state.remove(r)  # the kernel refuses a removal of what it does not hold
        for v, a, p, _left in adds:
            state.add((v, a, p))
        assert shared <= state  # never a ban of the list left out
        assert state <= set(h) | set(w)
        intervals = sorted(_span(v, a, p) + (v,) for v, a, p in state if p < (32 if v == 4 else 128))
        for (_lo1, hi1, v1), (lo2, _hi2, v2) in zip(intervals, intervals[1:]):
            assert v1 != v2 or hi1 <= lo2, (intervals, steps)  # no two overlapping intervals
    assert state == set(w)
    # every change once, and the adds come before the steps that only remove
    assert sorted(x for s in steps for x in s[0]) == sorted(add_t)
    assert sorted(x for s in steps for x in s[1]) == sorted(remove_t)
    only_removes = [not s[0] for s in steps]
    assert only_removes == sorted(only_removes)


def test_steps_hold_about_step_elements_and_keep_groups_whole():
    """An address is one element, an interval two; a step may exceed `step` only by
    a group that cannot be cut (an added prefix and the held ones it overlaps)."""
    base = 10 << 24
    held = {4: {(base + (i << 8), 24): 1000 for i in range(8)}, 6: {}}  # 8 /24s, dropped
    wanted = [(4, base, 16, 3000.0)] + [(4, (11 << 24) + i, 32, 3000.0) for i in range(10)]
    add_t, remove_t = _difference(wanted, held, 0.0)
    steps = diff_steps(add_t, remove_t, 4)
    # the /16 and the 8 /24s inside it go together (one transaction), then the addresses 4 a step
    assert steps[0][0] == [wanted[0]] and sorted(steps[0][1]) == sorted(remove_t), steps
    assert [len(a) for a, _r in steps[1:]] == [4, 4, 2], steps


def test_elements_made_from_integers_are_those_made_of_network_objects():
    """_tuple_changes (a step's elements made from the integers: change() and
    sync_prefixes) sends the kernel byte for byte the messages elements.py makes of the
    same prefixes as network objects (_changes, which replace() writes)."""
    import ipaddress

    from netlimit.kernel.nft import elements as nfelements
    from netlimit.kernel.nft.bansets import _changes, _tuple_changes

    nets = [
        "10.0.0.0/24", "10.0.1.0/24", "10.0.2.7/32", "255.255.255.0/24", "192.0.2.1/32",
        "2001:db8::/64", "2001:db9::7/128", "ffff::/16",
    ]  # fmt: skip
    add = {ipaddress.ip_network(n): 60.0 + i for i, n in enumerate(nets)}
    gone = [ipaddress.ip_network(n) for n in ("10.9.0.0/16", "10.9.1.1/32", "2001:dba::/48", "2001:dbb::1/128")]
    add_t = [(n.version, int(n.network_address), n.prefixlen, left) for n, left in add.items()]
    remove_t = [(n.version, int(n.network_address), n.prefixlen) for n in gone]
    for a, r in ((add, gone), (add, []), ({}, gone)):
        ta = [t for t in add_t if a]
        tr = [t for t in remove_t if r]
        want = [m for c in _changes(a, r, flush=False) if not c.empty for m in nfelements._messages(c, 1, 1)]
        got = [m for c in _tuple_changes(ta, tr) if not c.empty for m in nfelements._messages(c, 1, 1)]
        assert got == want


# --- what netlimit does not write, taken out in one transaction (foreign_plan) ---------------


@settings(max_examples=300, deadline=None)
@given(
    held=st.lists(st.one_of(_V4, _V6), max_size=30),
    odd=st.lists(
        st.tuples(st.one_of(_V4, _V6), st.sampled_from(["host", "prefix", "single", "range"]), st.integers(1, 9)),
        max_size=8,
    ),
    wanted=st.lists(st.one_of(_V4, _V6), max_size=30),
)
def test_taking_out_what_netlimit_does_not_write_keeps_every_ban(held, odd, wanted):
    """On a model of the four sets: the one transaction foreign_plan() makes takes out
    every element netlimit does not write (no timeout, an address or a range that is no
    prefix in an interval set), removes only what the sets hold, leaves no two
    overlapping intervals (the kernel refuses them), and every address the list bans
    that was banned before it (by netlimit's elements or the foreign ones) still is."""
    from netlimit.kernel.nft import elements as nfelements
    from netlimit.kernel.nft.bansets import foreign_plan

    h = _disjoint([_prefix(t) for t in held])
    w = sorted(_disjoint([_prefix(t) for t in wanted]))
    hosts = {(v, a): True for v, a, p in h if p == (32 if v == 4 else 128)}  # -> has a timeout
    spans = {(v,) + _span(v, a, p): True for v, a, p in h if p < (32 if v == 4 else 128)}
    for t, kind, length in odd:  # foreign elements, where the kernel would take them
        v, a, p = _prefix(t)
        bits = 32 if v == 4 else 128
        if kind == "host":
            hosts.setdefault((v, a), False)
            continue
        lo, hi = (a, a + 1) if kind == "single" else (a, a + length + 1) if kind == "range" else _span(v, a, p)
        if any(u == v and f < hi and lo < e for u, f, e in spans):
            continue  # the kernel refuses an overlapping interval
        spans[(v, lo, hi)] = kind in ("single", "range") and length % 2 == 0  # some with a timeout
    raw: dict[tuple[int, bool], list] = {(4, False): [], (4, True): [], (6, False): [], (6, True): []}
    for (v, a), timed in hosts.items():
        width = 4 if v == 4 else 16
        raw[(v, False)].append(nfelements.Element(a.to_bytes(width, "big"), False, 1000 if timed else None))
    for v in (4, 6):
        raw[(v, True)].append(nfelements.Element(bytes(4 if v == 4 else 16), True, None))  # the lower bound
    for (v, lo, hi), timed in spans.items():
        width = 4 if v == 4 else 16
        raw[(v, True)].append(nfelements.Element(lo.to_bytes(width, "big"), False, 1000 if timed else None))
        raw[(v, True)].append(nfelements.Element(hi.to_bytes(width, "big"), True, None))

    def banned(state_hosts, state_spans, v, x):
        return (v, x) in state_hosts or any(u == v and lo <= x < hi for u, lo, hi in state_spans)

    prefixes = [(v, a, p, 600.0) for v, a, p in w]
    adds, removes, gone = foreign_plan(prefixes, raw)
    ours = {(v, lo, hi) for v, lo, hi in spans if not _foreign_span(lo, hi, spans[(v, lo, hi)])}
    foreign_hosts = {k for k, timed in hosts.items() if not timed}
    assert sorted((v, a) for v, interval, a, _e in gone if not interval) == sorted(foreign_hosts)
    assert sorted((v, a, e) for v, interval, a, e in gone if interval) == sorted(set(spans) - ours)
    after_hosts = set(hosts) - foreign_hosts
    after_spans = set(ours)
    for v, a, p in removes:  # only netlimit's own, held
        bits = 32 if v == 4 else 128
        assert p < bits and (v,) + _span(v, a, p) in after_spans, (v, a, p)
        after_spans.remove((v,) + _span(v, a, p))
    for v, a, p, _left in adds:
        if p == (32 if v == 4 else 128):
            after_hosts.add((v, a))
        else:
            after_spans.add((v,) + _span(v, a, p))
    ordered = sorted(after_spans)
    for (v1, _lo1, hi1), (v2, lo2, _hi2) in zip(ordered, ordered[1:]):
        assert v1 != v2 or hi1 <= lo2, ordered  # no two overlapping intervals
    points = {(v, x) for v, a, p in w for x in (a, _span(v, a, p)[1] - 1)}
    points |= {(v, x) for v, lo, hi in spans for x in (lo, hi - 1)} | set(hosts)
    for v, x in points:
        listed = any(u == v and _span(u, a, p)[0] <= x < _span(u, a, p)[1] for u, a, p in w)
        if listed and banned(set(hosts), set(spans), v, x):
            assert banned(after_hosts, after_spans, v, x), (v, x, adds, removes, gone)


def _foreign_span(lo: int, hi: int, timed: bool) -> bool:
    size = hi - lo
    return not timed or size == 1 or bool(size & (size - 1)) or bool(lo & (size - 1))
