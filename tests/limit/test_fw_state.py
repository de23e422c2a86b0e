"""The fixed window's packed state: ``window << b | count`` with ``b = (limit + 1).bit_length()``
(fixed_window: Lyft's counting, the count saturated at limit + 1) or ``limit.bit_length()``
(fixed_window_admitted).

The field width follows the limit so that the state int stays below 2**60 (a
32-byte object, bench/memory.py's <= 150 B/key) also at a 1 s period, where
the window index alone is ~31 bits. The decider, the benchmark's verdict-only
admitter (bench/admit.py) and MemoryStore's inlined copy must read and write the same layout.
"""

from __future__ import annotations

import math
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.admit import ADMITTERS, DENIED, DeniedTo
from netlimit.limit.algorithms import Limit, decide, fixed_window
from netlimit.limit.stores import MemoryStore

NOW = 1_795_000_000.25  # late 2026: a window index of 31 bits at period 1 s


def test_state_stays_a_small_int_at_one_second():
    limit = Limit("fixed_window", 1000, 1.0)
    _, state = fixed_window(limit, None, NOW)
    assert state < 2**60 and sys.getsizeof(state) == 32
    assert state >> limit._cb == int(NOW) and state & limit._cm == 1


def test_lyft_state_saturates_and_stays_small():
    limit = Limit("fixed_window", 3, 1.0)
    state = None
    for _ in range(1000):  # a client hammering far over its limit
        _, state = fixed_window(limit, state, NOW, 7)
    assert state & limit._cm == 4 and state >> limit._cb == int(NOW) and sys.getsizeof(state) == 32


@pytest.mark.parametrize("alg", ["fixed_window", "fixed_window_admitted"])
@settings(max_examples=300, deadline=None)
@given(
    lim=st.integers(0, 2**20),
    period=st.sampled_from([1.0, 10.0, 60.0, 3600.0]),
    steps=st.lists(st.tuples(st.floats(0, 3.0), st.integers(0, 5)), min_size=1, max_size=40),
)
def test_decider_admitter_and_store_agree(alg, lim, period, steps):
    """Same verdicts and remaining counts from the three copies, against a plain
    counter: every hit counts (fixed_window, as Lyft's INCRBY) or only admitted ones."""
    limit = Limit(alg, lim, period)
    store = MemoryStore(max_keys=10)
    admit = ADMITTERS[alg] if not limit._deny0 else None
    lyft = alg == "fixed_window"
    now, d_state, a_state = NOW, None, None
    counts: dict[int, int] = {}
    for dt, cost in steps:
        now += dt * period
        w = math.floor(now / period)  # the window as the algorithm computes it
        used = counts.get(w, 0)
        expect = used + cost <= lim
        d, d_state = decide(limit, d_state, now, cost)
        s = store.hit_sync("k", limit, cost, now=now)
        assert d.allowed is expect and s.allowed is expect
        if admit is not None:
            got = admit(limit, a_state, now, cost)
            assert (got is not DENIED and not isinstance(got, DeniedTo)) is expect
            if isinstance(got, DeniedTo):
                a_state = got.state
            elif expect and cost:
                a_state = got
            assert a_state == d_state
        if expect or lyft:
            counts[w] = used + cost
        if lyft:
            assert d.remaining == s.remaining == (lim - counts[w] if expect else 0)
            if d_state is not None and d_state >> limit._cb == w:  # (a probe leaves an older window's state)
                assert d_state & limit._cm == min(counts[w], lim + 1)
        else:
            assert d.remaining == s.remaining == max(lim - counts.get(w, 0), 0)
            assert d_state is None or d_state & limit._cm <= lim
