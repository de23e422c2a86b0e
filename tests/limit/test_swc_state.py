"""The sliding window counter's packed state (``swc_pack`` / ``swc_unpack``) and
its per-Limit decider / admitter, held to the encoding-free reference: the
algorithm as it was written before the packing changed, over a plain
``(window, previous, current)`` tuple.  Same Decision (every field, bit for
bit) and the same counts after every event, on event streams that sit on
window boundaries, step the clock back, sleep for very many windows, fill the
count fields to their maximum, and use limits too big for the 60-bit form."""

from __future__ import annotations

import math
import sys
from dataclasses import astuple

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bench.admit import DENIED, DeniedTo, _swc_admit_of, admit
from netlimit.limit.algorithms import (
    Decision,
    Limit,
    decide,
    is_idle,
    sliding_window_counter,
    swc_pack,
    swc_unpack,
)

INF = math.inf
MAX_LIMIT = 0xFFFFFFFF
PROPS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------------- reference


def ref_swc(limit: Limit, state: tuple[int, int, int] | None, now: float, cost: int):
    """algorithms.sliding_window_counter before the state was packed per limit
    (``window << 64 | previous << 32 | current``), with the fields in a tuple."""
    lim = limit.limit
    period = limit.period
    w = math.floor(now / period)
    prev = 0
    curr = 0
    if state is not None:
        sw, sp, sc = state
        if sw >= w:
            w = sw
            prev = sp
            curr = sc
        elif sw == w - 1:
            prev = sc
    ws = w * period
    elapsed = now - ws
    if elapsed < 0:
        elapsed = 0.0
    x = prev * (1 - elapsed / period)
    hold = math.floor(lim - x)
    if x + (hold + 1) <= lim:
        hold += 1
    elif x + hold > lim:
        hold -= 1
    n = curr + cost
    if cost > lim or n > hold:
        if cost > lim:
            retry = INF
        else:
            room = lim - cost - curr
            if room >= 0 and prev > 0:
                t = ws + period * (1 - room / prev)
            else:
                room = lim - cost
                if curr <= room:
                    t = ws + period
                else:
                    t = ws + period + period * (1 - room / curr)
            retry = t - now
            if retry < 0:
                retry = 0.0
        if curr > 0:
            reset = (w + 2) * period - now
        elif prev > 0:
            reset = (w + 1) * period - now
        else:
            reset = 0.0
        return Decision(False, lim, hold - curr if hold > curr else 0, retry, reset), state
    if cost == 0:
        if curr > 0:
            reset = (w + 2) * period - now
        elif prev > 0:
            reset = (w + 1) * period - now
        else:
            reset = 0.0
        return Decision(True, lim, hold - n, 0.0, reset), state
    return Decision(True, lim, hold - n, 0.0, (w + 2) * period - now), (w, prev, n)


def ref_is_idle(limit: Limit, state: tuple[int, int, int] | None, now: float) -> bool:
    if state is None:
        return True
    w = math.floor(now / limit.period)
    return state[0] < w - 1 or (state[0] == w - 1 and state[2] == 0)


def same(a: Decision, b: Decision) -> bool:
    """Field by field, floats bit for bit (0.0 and -0.0 differ, as they would in headers)."""
    return all(
        x == y and (not isinstance(x, float) or math.copysign(1, x) == math.copysign(1, y))
        for x, y in zip(astuple(a), astuple(b))
    )


# --------------------------------------------------------------------------- strategies

# limits that fill their count field exactly (2**k - 1: the packed maximum), one
# past it (2**k: a field one bit wider), small ones, and the largest allowed
_LIMITS = st.sampled_from(
    [1, 2, 3, 7, 8, 10, 255, 256, 1000, 16383, 16384, 131071, 131072, 2**31 - 1, 2**31, MAX_LIMIT]
) | st.integers(1, MAX_LIMIT)
_PERIODS = st.sampled_from([1e-3, 0.1, 0.5, 1.0, 7.3, 60.0, 3600.0, 86400.0])


@st.composite
def swc_limits(draw):
    return Limit("sliding_window_counter", draw(_LIMITS), draw(_PERIODS))


@st.composite
def streams(draw, limit: Limit):
    """(now, cost) events around window boundaries of ``limit``."""
    p = limit.period
    lim = limit.limit
    start = draw(st.sampled_from([0, 1, -3, 1_000_000, 1_763_780_000 // max(1, int(p)), 2**31 + 5]))
    t = start * p + draw(st.sampled_from([0.0, 0.25, 0.5, 0.999]) | st.floats(0, 1)) * p
    cost = st.sampled_from([1, 1, 1, 1, 0, 2, 3, lim, lim - 1, lim + 1]) | st.integers(0, min(lim + 1, 2**33))
    out = []
    for _ in range(draw(st.integers(1, 40))):
        kind = draw(st.integers(0, 7))
        if kind == 0:  # to the next window boundary, exactly or one ulp either side
            k = math.floor(t / p) + 1
            t = draw(st.sampled_from([math.nextafter(k * p, -INF), k * p, math.nextafter(k * p, INF)]))
        elif kind == 1:  # the clock steps back
            t -= draw(st.floats(0, 2 * p))
        elif kind == 2:  # a key asleep for very many windows (no wrap-around may ever alias it)
            t += draw(st.sampled_from([2**8, 2**16, 2**20, 2**32, 2**40])) * p
        elif kind == 3:  # same instant
            pass
        else:
            t += draw(st.sampled_from([p / 100, p / 10, p / 3, p / 2, p]) | st.floats(0, 2.5 * p))
        out.append((t, max(0, draw(cost))))
    return out


@st.composite
def swc_cases(draw):
    limit = draw(swc_limits())
    return limit, draw(streams(limit))


# --------------------------------------------------------------------------- the packing


@PROPS
@given(limit=swc_limits(), data=st.data())
def test_pack_round_trips(limit, data):
    lim = limit.limit
    count = st.sampled_from([0, 1, lim, lim - 1]) | st.integers(0, lim)
    window = st.sampled_from([0, 1, -1, 2**25, 2**31 - 1, 2**31, 2**40, 2**60, -(2**40)]) | st.integers(-(2**70), 2**70)
    w, p, c = data.draw(window), data.draw(count), data.draw(count)
    s = swc_pack(limit, w, p, c)
    assert swc_unpack(limit, s) == (w, p, c)
    # ordered like the window index: a later window is always a larger state
    assert swc_pack(limit, w + 1, 0, 0) > s


@pytest.mark.parametrize("lim", [1, 1000, 2**17 - 1, 2**32 - 1])
def test_pack_refuses_counts_outside_0_to_limit(lim):
    limit = Limit("sliding_window_counter", lim, 60)
    for p, c in ((lim + 1, 0), (0, lim + 1), (-1, 0), (0, -1)):
        with pytest.raises(ValueError):
            swc_pack(limit, 5, p, c)


@pytest.mark.parametrize(
    "lim,period,small",
    [
        (1000, 60.0, True),  # the benchmark's rule
        (2**17 - 1, 60.0, True),  # the largest per-minute limit packed in 60 bits
        (2**14 - 1, 1.0, True),  # the largest per-second one
        (2**17, 60.0, False),  # one more bit per count: a wider int, same decisions
        (2**32 - 1, 1.0, False),  # too big for the packed form
    ],
)
def test_state_stays_below_2_to_60_for_the_usual_limits(lim, period, small):
    """Below 2**60 an int is two 30-bit digits, 32 bytes; a 36-byte one takes a
    48-byte pymalloc block.  The window index at 2026's clock (until 2038)."""
    limit = Limit("sliding_window_counter", lim, period)
    now = 2**31 - 1.0  # 2038-01-19
    _, s = sliding_window_counter(limit, None, now, 1)
    _, s = sliding_window_counter(limit, s, now + period, lim - 1)  # previous 1, current lim - 1
    s_max = swc_pack(limit, swc_unpack(limit, s)[0], lim, lim)
    assert (s_max < 2**60) is small
    assert (sys.getsizeof(s_max) == sys.getsizeof(2**60 - 1)) is small
    assert swc_unpack(limit, s) == (math.floor((now + period) / period), 1, lim - 1)


# --------------------------------------------------------------------------- the algorithm


@PROPS
@given(swc_cases())
@example(
    case=(
        Limit("sliding_window_counter", 7, 1.0),
        [(0.5, 7), (1.0, 0), (1.5, 4), (1.5, 1), (2.0, 7), (2.0 - 2**-40, 1), (2**32 + 2.0, 7), (2**32 + 2.5, 1)],
    )
)
@example(
    case=(
        Limit("sliding_window_counter", MAX_LIMIT, 1e-3),
        [(1.7e9, MAX_LIMIT), (1.7e9 + 1e-3, MAX_LIMIT), (1.7e9 + 1.5e-3, 1), (1.7e9 + 2e-3, 0)],
    )
)
def test_decide_and_admit_agree_with_the_unpacked_reference(case):
    limit, events = case
    s_dec = s_adm = ref = None
    for i, (now, cost) in enumerate(events):
        want, ref_new = ref_swc(limit, ref, now, cost)
        d, s_new = decide(limit, s_dec, now, cost)
        assert same(d, want), (i, now, cost, d, want)
        if not d.allowed or cost == 0:
            assert s_new is s_dec  # the very same object: nothing changes
        got = admit(limit, s_adm, now, cost)
        assert (got is not DENIED) == want.allowed, (i, now, cost)
        if got is not DENIED:
            s_adm = got
        s_dec = s_new
        ref = ref_new
        assert s_adm == s_dec
        if ref is None:
            assert s_dec is None
        else:
            assert swc_unpack(limit, s_dec) == ref
            assert 0 <= ref[1] <= limit.limit and 0 <= ref[2] <= limit.limit
            assert is_idle(limit, s_dec, now) == ref_is_idle(limit, ref, now)


def test_a_state_many_windows_old_reads_as_empty():
    """The window index is kept whole: after 2**k windows (any k) a full state is
    gone, never mistaken for the current window as a wrapped index would be."""
    limit = Limit("sliding_window_counter", 10, 1.0)
    _, s = sliding_window_counter(limit, None, 100.5, 10)
    for k in (1, 2, 3, 8, 16, 20, 32, 40, 62, 64):
        now = 100.5 + 2**k
        d, _ = sliding_window_counter(limit, s, now, 10)
        assert d.allowed and d.remaining == 0, k
        assert admit(limit, s, now, 10) is not DENIED
    # one window later, the full previous window still counts
    assert admit(limit, s, 101.0, 1) is DENIED
    assert admit(limit, s, 101.5, 5) is not DENIED and admit(limit, s, 101.5, 6) is DENIED


# --------------------------------------------------------------------------- the denial horizon


def _horizon(limit: Limit):
    """The admitter's remembered (state, cost, t), read from its closure."""
    fn = _swc_admit_of(limit)
    return fn.__closure__[fn.__code__.co_freevars.index("horizon")].cell_contents


def _flip(limit: Limit, ref, cost: int, lo: float, hi: float) -> float:
    """The first float in (lo, hi] at which the reference admits (denied at lo)."""
    while math.nextafter(lo, INF) < hi:
        mid = (lo + hi) / 2
        if mid <= lo or mid >= hi:
            mid = math.nextafter(lo, INF)
        if ref_swc(limit, ref, mid, cost)[0].allowed:
            hi = mid
        else:
            lo = mid
    return hi


@pytest.mark.parametrize(
    "lim,period,prev,curr",
    [
        (1000, 60.0, 1000, 0),  # the benchmark's rule, a full previous window decaying
        (1000, 60.0, 1000, 400),
        (1000, 60.0, 0, 1000),  # no previous window, the current one full: denied to its end
        (7, 0.1, 7, 3),
        (2**32 - 1, 1.0, 2**32 - 1, 2**32 - 10),  # too big for 60 bits
        (3, 1e-3, 2, 1),
    ],
)
def test_a_hammered_state_is_denied_from_memory_exactly_until_it_fits(lim, period, prev, curr):
    limit = Limit("sliding_window_counter", lim, period)
    w = 29_396_340 if period == 60.0 else math.floor(1_763_780_400 / period)
    state = swc_pack(limit, w, prev, curr)
    ref = (w, prev, curr)
    ws = w * period
    start = ws + period * 1e-4
    assert admit(limit, state, start, 1) is DENIED and admit(limit, state, start, 1) is DENIED
    s, cost, t = _horizon(limit)
    assert s is state and cost == 1 and start < t  # remembered on the second denial in a row
    # the moment it fits, one ulp at a time around it (or the window's end)
    end = _flip(limit, ref, 1, start, ws + 2 * period)
    assert t < end
    probes = [start, t, math.nextafter(t, INF), (t + end) / 2, end, math.nextafter(end, INF)]
    probes += [math.nextafter(end, -INF)] + [end - k * 2**-30 * period for k in range(1, 40)]
    for now in probes + [start - period, ws - 5 * period]:  # and a clock stepped back
        admit(limit, state, start, 1)  # re-prime: the horizon is this state's
        want = ref_swc(limit, ref, now, 1)[0].allowed
        assert (admit(limit, state, now, 1) is not DENIED) == want, (now, t, end)
        assert (admit(limit, state, now, 1) is not DENIED) == want, (now, t, end)  # from memory, if remembered
    # another cost is not answered from this memory
    admit(limit, state, start, 1)
    for cost in (0, 2, lim, lim + 1):
        want = ref_swc(limit, ref, start, cost)[0].allowed
        assert (admit(limit, state, start, cost) is not DENIED) == want, cost


def test_the_horizon_is_per_limit_and_per_state():
    a = Limit("sliding_window_counter", 10, 1.0)
    b = Limit("sliding_window_counter", 10, 1.0, name="other")
    sa = swc_pack(a, 100, 10, 0)
    for _ in range(3):
        assert admit(a, sa, 100.05, 1) is DENIED
    assert _horizon(a)[0] is sa and _horizon(b)[0] is None
    # an equal value in another object: the same decisions (they depend on the value only)
    sb = swc_pack(a, 100, 10, 0) + 0 * sa
    for now in (100.05, 100.0999, 100.1, 100.10001, 100.5):
        assert (admit(a, sb, now, 1) is DENIED) == (not ref_swc(a, (100, 10, 0), now, 1)[0].allowed)


# --------------------------------------------------------------------------- fixed window


@PROPS
@given(data=st.data())
def test_fixed_window_admitter_agrees_with_its_decider_on_window_edges(data):
    """The fixed window's verdict-only path against its decider, one ulp either
    side of window edges, clock steps back, long sleeps (its state is packed too)."""
    limit = Limit("fixed_window", data.draw(_LIMITS), data.draw(_PERIODS))
    s_dec = s_adm = None
    for now, cost in data.draw(streams(limit)):
        d, s_dec = decide(limit, s_dec, now, cost)
        got = admit(limit, s_adm, now, cost)
        assert (got is not DENIED and not isinstance(got, DeniedTo)) == d.allowed, (now, cost)
        if isinstance(got, DeniedTo):  # Lyft's counting: a denial may write the saturated count
            s_adm = got.state
        elif got is not DENIED:
            s_adm = got
        assert s_adm == s_dec
