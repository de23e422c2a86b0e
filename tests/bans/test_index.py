"""The index of a host's active bans: what its kernel set must hold. Checked against a
brute-force model with random operations (hypothesis)."""

from __future__ import annotations

import ipaddress

from hypothesis import given, settings
from hypothesis import strategies as st

from netlimit.bans.index import BanIndex
from netlimit.bans.model import Ban

N = ipaddress.ip_network


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def ban(net: str) -> Ban:
    return Ban.make(N(net), 0.0)


# prefixes in a small space, so that they nest and overlap often
nets4 = st.builds(
    lambda a, p: str(ipaddress.ip_network(f"10.0.{a >> 8}.{a & 255}/{p}", strict=False)),
    st.integers(0, 1023),
    st.sampled_from([22, 23, 24, 30, 32]),
)
nets6 = st.builds(
    lambda a, p: str(ipaddress.ip_network(f"2001:db8:0:{a:x}::/{p}", strict=False)),
    st.integers(0, 15),
    st.sampled_from([60, 62, 64]),
)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.one_of(nets4, nets6), st.integers(1, 50)),
        st.tuples(st.just("remove"), st.one_of(nets4, nets6), st.just(0)),
        st.tuples(st.just("tick"), st.just(""), st.integers(1, 20)),
    ),
    max_size=60,
)


def maximal(active: set) -> set:
    return {n for n in active if not any(o != n and o.version == n.version and n.subnet_of(o) for o in active)}


@settings(max_examples=300, deadline=None)
@given(ops, st.booleans())
def test_the_kernel_view_follows_the_list(script, cover):
    clock = Clock()
    idx = BanIndex(1000, cover=cover, clock=clock)
    model: dict = {}  # net -> deadline
    kernel: dict = {}  # what the deltas built, as the kernel would hold it
    for op, net, n in script:
        if op == "put":
            d = idx.put(ban(net), float(n))
            model[N(net)] = clock.t + n
        elif op == "remove":
            d = idx.remove(N(net))
            model.pop(N(net), None)
        else:
            clock.t += n
            gone, d = idx.expire()
            for b in gone:
                assert model.pop(b.net) <= clock.t
            for k in [k for k, dl in kernel.items() if dl <= clock.t]:
                del kernel[k]  # the kernel drops expired elements by itself
        for r in d.remove:
            kernel.pop(r, None)
        kernel.update(d.add)
        model = {k: dl for k, dl in model.items() if dl > clock.t}
        active = set(model)
        assert set(idx.bans) == active
        want = maximal(active) if cover else active
        assert set(idx.shown) == want
        assert {k for k, dl in kernel.items() if dl > clock.t} == want
        for k in want:
            assert idx.shown[k] == model[k]
        if cover:  # an interval set refuses overlaps
            shown = sorted(idx.shown, key=lambda x: (x.version, x))
            for a in shown:
                assert not any(b != a and a.version == b.version and a.overlaps(b) for b in shown)


def test_an_inner_ban_shows_when_the_outer_one_ends():
    clock = Clock()
    idx = BanIndex(100, cover=True, clock=clock)
    assert set(idx.put(ban("10.0.0.7/32"), 100).add) == {N("10.0.0.7/32")}
    d = idx.put(ban("10.0.0.0/24"), 10)
    assert set(d.add) == {N("10.0.0.0/24")} and d.remove == {N("10.0.0.7/32")}
    clock.t += 11
    gone, d = idx.expire()
    assert [b.net for b in gone] == [N("10.0.0.0/24")]
    assert d.add == {N("10.0.0.7/32"): clock.t - 11 + 100}


def test_bounded_the_ban_that_expires_first_goes():
    clock = Clock()
    idx = BanIndex(3, cover=True, clock=clock)
    for i, ttl in enumerate((30, 10, 20)):
        idx.put(ban(f"192.0.2.{i}/32"), ttl)
    d = idx.put(ban("192.0.2.9/32"), 40)
    assert N("192.0.2.1/32") in d.remove and len(idx) == 3 and idx.evicted == 1
    idx.replace([(ban(f"198.51.100.{i}/32"), float(i + 1)) for i in range(5)])
    assert {b.net for b, _ in idx.bans.values()} == {N(f"198.51.100.{i}/32") for i in (2, 3, 4)}
    assert idx.evicted == 3


def test_replace_says_what_changed():
    clock = Clock()
    idx = BanIndex(100, cover=True, clock=clock)
    idx.replace([(ban("10.0.0.0/24"), 10.0), (ban("10.0.0.1/32"), 20.0), (ban("10.1.0.0/24"), 5.0)])
    assert set(idx.shown) == {N("10.0.0.0/24"), N("10.1.0.0/24")}
    d = idx.replace([(ban("10.0.0.1/32"), 20.0)])
    assert d.remove == {N("10.0.0.0/24"), N("10.1.0.0/24")} and set(d.add) == {N("10.0.0.1/32")}
    assert idx.replace([(ban("10.0.0.1/32"), 0.0)]).remove == {N("10.0.0.1/32")}  # time up: not a ban
