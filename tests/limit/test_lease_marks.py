"""The cold path of leasing (issue 33: with ``http.leases: on`` a cold key costs what it
costs with leases off): LeasedRedisStore.hit_leasing marks a key's first sight over this
tick and the last in a fixed table and counts it from its second sight on; a key seen
often enough goes to the leasing path.  The store's Redis calls are replaced by
recorders and its clock by a fake one the test moves: what is asserted is the routing
and the counting, decision by decision, against a model (hypothesis).  That a hot key
then really leases from a real redis-server is in test_leases.py
(test_a_key_counted_from_its_second_sight_goes_hot_and_leases)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from netlimit.limit.algorithms import FIXED_WINDOW, Limit
from netlimit.limit.stores import LeasedRedisStore
from netlimit.limit.stores import lease as lease_mod

KEYS = [f"10.9.0.{i}" for i in range(6)]
LIM = Limit(FIXED_WINDOW, 1000, 60.0, name="marks-model")
#: sights over this tick and the last from which a key goes to the leasing path
#: (HOT_RATE * TICK, the first sight not counted: the fifth counted one)
HOT_SIGHTS = 5


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def recorded_store() -> tuple[LeasedRedisStore, list[tuple[str, str]]]:
    """A store whose one-trip path and leasing path only record the key."""
    store = LeasedRedisStore("redis://127.0.0.1:1/0", key_prefix="marks")
    calls: list[tuple[str, str]] = []

    async def one_trip(key: str, limit: Limit, cost: int = 1) -> Any:
        calls.append(("cold", key))

    async def leasing(key: str, limit: Limit, cost: int, k: str, seen: float) -> Any:
        calls.append(("lease", key))

    store.hit = one_trip  # type: ignore[method-assign]
    store._hit_leasing = leasing  # type: ignore[method-assign]
    return store, calls


ops = st.lists(
    st.one_of(st.sampled_from(KEYS), st.sampled_from(["roll", "gap"])),
    max_size=120,
)


@contextlib.contextmanager
def clock_in_leases(clock):
    """The lease module reads `clock` for monotonic() meanwhile (a hypothesis test cannot
    take pytest's function-scoped monkeypatch)."""
    real = lease_mod.monotonic
    lease_mod.monotonic = clock
    try:
        yield
    finally:
        lease_mod.monotonic = real


@settings(max_examples=150, deadline=None)
@given(ops)
def test_first_sights_are_marked_repeats_counted_and_hot_keys_lease(seq):
    """Decision by decision: a key's first sight over this tick and the last is not
    counted (nothing in ``_cur``), every later one is; a key goes to the leasing path
    once its counted sights over this tick and the last reach HOT_SIGHTS; every
    other decision is one cold decision (and one round trip) in the stats."""
    assume(len({hash(k) & lease_mod._MARK_MASK for k in KEYS}) == len(KEYS))  # no two keys in one slot
    clock = Clock()

    async def run() -> None:
        store, calls = recorded_store()
        tick = 0  # the model's tick
        last: dict[str, int] = {}  # key -> the tick of its last sight
        cur: dict[str, int] = {}
        prev: dict[str, int] = {}
        cold = 0
        try:
            for op in seq:
                if op in ("roll", "gap"):
                    # a roll at the tick's end (the last tick stays the previous one), or a
                    # tick later (no decision for a whole tick: nothing of the last one counts)
                    clock.t = store._tick_end + (0.0 if op == "roll" else lease_mod.TICK + 0.01)
                    store._roll(clock.t)
                    tick += 1 if op == "roll" else 2
                    prev, cur = (cur if op == "roll" else {}), {}
                    continue
                key = op
                fresh = last.get(key, -10) >= tick - 1
                last[key] = tick
                if fresh:
                    cur[key] = cur.get(key, 0) + 1
                n = len(calls)
                await store.hit_leasing(key, LIM, 1)
                hot = fresh and cur[key] + prev.get(key, 0) >= HOT_SIGHTS
                assert calls[n:] == [("lease" if hot else "cold", key)], (op, cur, prev)
                cold += not hot
                counted = {k[len(LIM._ns) :]: c for k, c in store._cur.items()}
                assert counted == cur, (op, counted, cur)
                assert store._marks[hash(key) & lease_mod._MARK_MASK] == store._stamp
            st_ = store.lease_stats
            assert st_.decisions == st_.round_trips == cold
            assert st_.granted == 0
        finally:
            store._stop_clock()

    with clock_in_leases(clock):
        asyncio.run(run())


def test_a_key_seen_once_per_tick_is_never_counted_even_across_a_stamp_wrap():
    """10,000 keys each seen once, 300 ticks (the stamps wrap at 255 and the table is
    zeroed): none enters the rate tracking; a key seen in every tick is counted from
    its second sight, also across the wrap (its mark from before it is gone: counted
    from its next sight on, never more than its own sights)."""
    clock = Clock()

    async def run() -> None:
        store, calls = recorded_store()
        steady = LIM._ns + "steady"
        mine = hash("steady") & lease_mod._MARK_MASK
        try:
            i = n = shared = 0
            for tick in range(300):
                for _ in range(33):
                    key = f"172.16.{i >> 8 & 255}.{i & 255}:{i}"
                    i += 1
                    if hash(key) & lease_mod._MARK_MASK == mine:  # not in the steady key's slot
                        continue
                    await store.hit_leasing(key, LIM, 1)
                    n += 1
                await store.hit_leasing("steady", LIM, 1)
                others = {k: c for k, c in store._cur.items() if k != steady}
                # a cold key is counted only when it shares a slot with a key marked over
                # this tick and the last (~66 of 2**18 slots): then once, its one sight
                assert all(c == 1 for c in others.values()), (tick, others)
                shared += len(others)
                assert store._cur.get(steady, 0) == (0 if tick in (0, 255) else 1), tick
                clock.t = store._tick_end
                store._roll(clock.t)
            assert shared <= 30, shared  # expected ~2.5 (9,900 keys x 66 / 2**18)
            assert not any(c == "lease" for c, _ in calls)
            assert store.lease_stats.decisions == n + 300
        finally:
            store._stop_clock()

    with clock_in_leases(clock):
        asyncio.run(run())


def test_the_store_keeps_few_enough_attributes_for_the_fast_attribute_path():
    """CPython 3.11 shares one key table among a class's instances only up to 30 keys;
    the 30th attribute gives the store a dict of its own, and every attribute read of
    every decision (RedisStore.hit's, hit_leasing's) costs more: measured +360
    instructions per cold decision (bench/lease_cold_instructions.sh).  Rarely used
    state goes into LeasedRedisStore._aside instead of a new attribute."""
    store = LeasedRedisStore("redis://127.0.0.1:1/0", key_prefix="marks")
    try:
        assert len(vars(store)) <= 28, sorted(vars(store))
    finally:
        store._stop_clock()
