"""The benchmark's verdict-only paths (bench/admit.py: admit, allow_fn) against the
full deciders: same verdict and the same state after every event."""

from __future__ import annotations

import random
from array import array

import pytest

from bench.admit import DENIED, DeniedTo, admit, allow_fn
from netlimit.limit.algorithms import ALGORITHMS, Limit, decide
from netlimit.limit.stores import MemoryStore


def _limits(alg: str) -> list[Limit]:
    out = [Limit(alg, n, p) for n, p in ((1, 1.0), (3, 0.5), (10, 10.0), (7, 3.0), (0, 1.0))]
    if alg in ("token_bucket", "leaky_bucket"):
        out += [Limit(alg, 5, 1.0, burst=12)]
    if alg == "leaky_bucket":
        out += [Limit(alg, 4, 2.0, burst=3, delay=True)]
    return out


def _copy(state):
    return array("d", state) if isinstance(state, array) else state


def _events(rng: random.Random, n: int):
    now = 1_000_000.0 + rng.random()
    for _ in range(n):
        r = rng.random()
        if r < 0.03:
            now -= rng.random() * 2  # the clock steps back
        elif r < 0.5:
            now += rng.random() * 0.05  # bursts
        else:
            now += rng.expovariate(2.0)
        cost = rng.choice((1, 1, 1, 1, 0, 2, 3, 50))
        yield now, cost


@pytest.mark.parametrize("alg", ALGORITHMS)
def test_admit_equals_decide(alg):
    rng = random.Random(alg)
    for limit in _limits(alg):
        s_full = s_admit = None
        for i, (now, cost) in enumerate(_events(rng, 3000)):
            d, s_full = decide(limit, s_full, now, cost)
            got = admit(limit, s_admit, now, cost)
            assert (got is not DENIED and not isinstance(got, DeniedTo)) == d.allowed, (alg, limit, i, now, cost)
            if isinstance(got, DeniedTo):
                s_admit = got.state
            elif got is not DENIED:
                s_admit = got
            assert _copy(s_admit) == _copy(s_full) or (s_admit is None and s_full is None), (alg, limit, i)


@pytest.mark.parametrize("alg", ALGORITHMS)
def test_allow_sync_equals_hit_sync(alg):
    """Two stores fed the same requests (keys enough to rotate the generations)."""
    rng = random.Random(alg + "store")
    a, b = MemoryStore(max_keys=64), MemoryStore(max_keys=64)
    limits = _limits(alg)
    for now, cost in _events(rng, 6000):
        key = f"k{rng.randrange(100)}"
        limit = rng.choice(limits)
        assert allow_fn(a, limit)(key, cost, now) == b.hit_sync(key, limit, cost, now).allowed
    assert sorted(a.stored_keys()) == sorted(b.stored_keys())
    assert a.evictions == b.evictions
