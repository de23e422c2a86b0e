"""The fixed window's packed state: ``window << b | count`` with ``b = limit.bit_length()``.

The field width follows the limit so that the state int stays below 2**60 (a
32-byte object, bench/memory.py's <= 150 B/key) also at a 1 s period, where
the window index alone is ~31 bits. The decider, the benchmark's verdict-only
admitter (bench/admit.py) and MemoryStore's inlined copy must read and write the same layout.
"""

from __future__ import annotations

import math
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from bench.admit import ADMITTERS, DENIED
from netlimit.limit.algorithms import Limit, fixed_window
from netlimit.limit.stores import MemoryStore

NOW = 1_795_000_000.25  # late 2026: a window index of 31 bits at period 1 s


def test_state_stays_a_small_int_at_one_second():
    limit = Limit("fixed_window", 1000, 1.0)
    _, state = fixed_window(limit, None, NOW)
    assert state < 2**60 and sys.getsizeof(state) == 32
    assert state >> limit._cb == int(NOW) and state & limit._cm == 1


@settings(max_examples=300, deadline=None)
@given(
    lim=st.integers(1, 2**20),
    period=st.sampled_from([1.0, 10.0, 60.0, 3600.0]),
    steps=st.lists(st.tuples(st.floats(0, 3.0), st.integers(0, 5)), min_size=1, max_size=40),
)
def test_decider_admitter_and_store_agree(lim, period, steps):
    """Same verdicts and remaining counts from the three copies, against a plain counter."""
    limit = Limit("fixed_window", lim, period)
    store = MemoryStore(max_keys=10)
    admit = ADMITTERS["fixed_window"]
    now, d_state, a_state = NOW, None, None
    counts: dict[int, int] = {}
    for dt, cost in steps:
        now += dt * period
        w = math.floor(now / period)  # the window as the algorithm computes it
        used = counts.get(w, 0)
        expect = used + cost <= lim
        d, d_state = fixed_window(limit, d_state, now, cost)
        got = admit(limit, a_state, now, cost)
        s = store.hit_sync("k", limit, cost, now=now)
        assert d.allowed is expect and s.allowed is expect and (got is not DENIED) is expect
        if expect:
            counts[w] = used + cost
            if cost:
                a_state = got
        assert d.remaining == s.remaining == max(lim - counts.get(w, 0), 0)
        assert d_state is None or d_state & limit._cm <= lim
