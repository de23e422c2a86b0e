"""One conformance suite for both stores.

Every case drives the same (time, key, cost) sequence through a store with an
injected clock and compares each Decision with the pure reference
(``algorithms.decide`` over a dict of states): ``allowed``, ``limit`` and
``remaining`` exactly, floats to 1e-6.  Parametrised over store = memory |
redis | cluster and over every algorithm (and their modes), so the Lua scripts
and the Python functions cannot drift apart; the cluster store routes each key
to its slot's primary (the keys include a ``{`` and ``}`` of their own).
MemoryStore-specific behaviour (bounds,
eviction, hashing) is at the end.
"""

from __future__ import annotations

import asyncio
import math
import random
import uuid
from array import array

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netlimit.limit.algorithms import ALGORITHMS, Decision, DynamicLimit, Limit, decide
from netlimit.limit.stores import MemoryStore, RedisStore, hash_key

LONG_KEY = "k" * 300
KEYS = ["a", "b", "1.2.3.4", "user:{42}}", "ключ", LONG_KEY]

LIMITS = {
    "token_bucket": Limit("token_bucket", 10, 1, burst=20),
    "token_bucket-odd-rate": Limit("token_bucket", 3, 7),
    "leaky_bucket": Limit("leaky_bucket", 5, 2, burst=3),
    "leaky_bucket-queue": Limit("leaky_bucket", 5, 2, burst=3, delay=True),
    "leaky_bucket-queue-default": Limit("leaky_bucket", 2, 1, delay=True),
    "fixed_window": Limit("fixed_window", 7, 1.5),
    "fixed_window-minute": Limit("fixed_window", 100, 60),
    "fixed_window_admitted": Limit("fixed_window_admitted", 7, 1.5),
    "fixed_window_admitted-minute": Limit("fixed_window_admitted", 100, 60),
    "sliding_window_counter": Limit("sliding_window_counter", 9, 2),
    "sliding_window_counter-minute": Limit("sliding_window_counter", 50, 60),
    "sliding_window_log": Limit("sliding_window_log", 6, 1.3),
    "sliding_window_log-long": Limit("sliding_window_log", 3, 10),
}
assert {lim.algorithm for lim in LIMITS.values()} == set(ALGORITHMS)


def arun(coro):
    return asyncio.run(coro)


@pytest.fixture(params=["memory", "redis", "cluster"])
def make_store(request):
    """An async factory of fresh stores of the parametrised kind: in memory, one
    redis-server, a Redis Cluster of three primaries (redis+cluster://)."""
    if request.param == "memory":

        async def make():
            return MemoryStore(max_keys=10_000, clock=lambda: pytest.fail("the injected now must be used"))
    else:
        server = request.getfixturevalue("redis_server" if request.param == "redis" else "redis_cluster")

        async def make():
            store = RedisStore(server.url, timeout_ms=2000, key_prefix=f"t{uuid.uuid4().hex[:8]}")
            await store.start()
            await store.load_scripts(*LIMITS.values())
            if request.param == "cluster":
                assert store.kind == "cluster"
            return store

    make.kind = request.param
    return make


def assert_same(got: Decision, want: Decision, where: str = "") -> None:
    assert (got.allowed, got.limit, got.remaining) == (want.allowed, want.limit, want.remaining), (
        f"{where}: got {got}, want {want}"
    )
    for f in ("retry_after", "reset", "delay"):
        g, w = getattr(got, f), getattr(want, f)
        assert g == w or abs(g - w) <= 1e-6, f"{where}: {f} got {g!r} want {w!r} ({got} vs {want})"


class Reference:
    """The pure algorithms over a dict of states: what every store must answer."""

    def __init__(self) -> None:
        self.states: dict[tuple[Limit, str], object] = {}

    def hit(self, key, limit, cost, now):
        d, self.states[limit, key] = decide(limit, self.states.get((limit, key)), now, cost)
        return d

    def peek(self, key, limit, cost, now):
        state = self.states.get((limit, key))
        if isinstance(state, array):
            state = array("d", state)
        return decide(limit, state, now, cost)[0]


async def drive(store, events):
    """events: (op, now, key, limit, cost); check each decision against the reference."""
    ref = Reference()
    for i, (op, now, key, limit, cost) in enumerate(events):
        want = getattr(ref, op)(key, limit, cost, now)
        got = await getattr(store, op)(key, limit, cost, now=now)
        assert_same(got, want, f"event {i} {op}({key!r}, {limit.algorithm}, cost={cost}, now={now!r})")


def random_events(limit: Limit, seed: int, n: int = 250, t0: float = 1_700_000_000.0):
    """Bursts at one instant, steps of all sizes (some landing exactly on
    window/slot boundaries), occasional clock steps backwards, costs from 0 to
    capacity + 1, probes (peek) between hits."""
    rng = random.Random(seed)
    p = limit.period
    slot = p / limit.limit
    t = t0 + rng.random() * p
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.4:
            pass
        elif r < 0.6:
            t += rng.choice([slot, slot / 2, 2 * slot])
        elif r < 0.7:
            t = (math.floor(t / p) + 1) * p  # exactly on the next window boundary
        elif r < 0.95:
            t += rng.random() * p
        else:
            t -= rng.random() * slot  # the clock steps back a little
        cost = rng.choice([1, 1, 1, 1, 1, 2, 3, 0, limit.capacity, limit.capacity + 1])
        op = "peek" if rng.random() < 0.1 else "hit"
        out.append((op, t, rng.choice(KEYS), limit, cost))
    return out


# ================================================================ the suite


@pytest.mark.parametrize("case", sorted(LIMITS))
def test_random_sequences_match_the_reference(make_store, case):
    limit = LIMITS[case]

    async def main():
        store = await make_store()
        try:
            await drive(store, random_events(limit, seed=sorted(LIMITS).index(case)))
        finally:
            await store.close()

    arun(main())


@pytest.mark.parametrize("case", sorted(LIMITS))
def test_dynamic_limits_match_the_reference(make_store, case):
    """A limit override's DynamicLimit: the same decisions, its numbers passed to
    one script per algorithm as arguments (Redis) and its states in the shared
    table of its algorithm (memory)."""
    f = LIMITS[case]
    limit = DynamicLimit(f.algorithm, f.limit, f.period, f.burst, f.delay, "override " + case)
    assert limit._ns.startswith("~")

    async def main():
        store = await make_store()
        try:
            await drive(store, random_events(limit, seed=100 + sorted(LIMITS).index(case)))
        finally:
            await store.close()

    arun(main())


@pytest.mark.parametrize("case", sorted(LIMITS))
def test_small_clock_values_match_the_reference(make_store, case):
    limit = LIMITS[case]

    async def main():
        store = await make_store()
        try:
            await drive(store, random_events(limit, seed=99, n=150, t0=0.0))
        finally:
            await store.close()

    arun(main())


@pytest.mark.parametrize("case", sorted(LIMITS))
def test_a_probe_leaves_expired_state_for_a_clock_that_steps_back(make_store, case):
    """peek decides on the state without changing it: what it finds expired is
    still there for a later hit whose now steps back before the probe's cutoff
    (a Redis probe of the sliding log used to remove it)."""
    limit = LIMITS[case]
    p = limit.period
    t = 1_000.0
    events = [
        ("hit", t, "a", limit, 1),
        ("hit", t + p / 2, "a", limit, 1),
        ("peek", t + 3 * p, "a", limit, 0),
        ("peek", t + 3 * p, "a", limit, 1),
        ("hit", t + p / 2, "a", limit, 2),
        ("hit", t + p / 2, "a", limit, limit.capacity),
    ]

    async def main():
        store = await make_store()
        try:
            await drive(store, events)
        finally:
            await store.close()

    arun(main())


def test_all_limits_interleaved_on_shared_keys(make_store):
    """Many limits on the same keys at once: state is per (limit, key)."""
    rng = random.Random(5)
    events = []
    t = 5_000.0
    for _ in range(400):
        t += rng.choice([0.0, 0.0, 0.01, 0.1, 0.7])
        limit = rng.choice(list(LIMITS.values()))
        events.append(("hit", t, rng.choice(KEYS[:3]), limit, rng.choice([1, 1, 2])))

    async def main():
        store = await make_store()
        try:
            await drive(store, events)
        finally:
            await store.close()

    arun(main())


PROPS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)


@st.composite
def hypo_cases(draw):
    alg = draw(st.sampled_from(ALGORITHMS))
    n = draw(st.integers(1, 8))
    period = draw(st.sampled_from([0.25, 1.0, 3.0, 60.0]))
    if alg in ("token_bucket", "leaky_bucket"):
        limit = Limit(
            alg,
            n,
            period,
            burst=draw(st.none() | st.integers(1, 9)),
            delay=alg == "leaky_bucket" and draw(st.booleans()),
        )
    else:
        limit = Limit(alg, n, period)
    t = draw(st.sampled_from([0.0, 1e3, 1.7e9]))
    events = []
    for _ in range(draw(st.integers(1, 40))):
        t += draw(st.sampled_from([0.0, 0.0, period / n, period]) | st.floats(-period / 4, 2 * period))
        cost = draw(st.integers(0, limit.capacity + 1))
        events.append(
            (draw(st.sampled_from(["hit", "hit", "hit", "peek"])), t, draw(st.sampled_from(KEYS[:2])), limit, cost)
        )
    return events


@PROPS
@given(events=hypo_cases())
def test_hypothesis_sequences_match_the_reference(make_store, events):
    async def main():
        store = await make_store()
        try:
            await drive(store, events)
        finally:
            await store.close()

    arun(main())


# ---------------------------------------------------------------- golden values

GOLDEN = {
    # token bucket 10/s burst 20: 20 at t=0, the 21st waits 0.1 s
    "token_bucket": (
        Limit("token_bucket", 10, 1, burst=20),
        [
            *[(0.0, 1, (True, 20, 19 - i, 0.0, (i + 1) / 10, 0.0)) for i in range(20)],
            (0.0, 1, (False, 20, 0, 0.1, 2.0, 0.0)),
            (0.05, 1, (False, 20, 0, 0.05, 1.95, 0.0)),
            (0.1, 1, (True, 20, 0, 0.0, 2.0, 0.0)),
            (0.1, 25, (False, 20, 0, math.inf, 2.0, 0.0)),
            (1.1, 5, (True, 20, 5, 0.0, 1.5, 0.0)),
        ],
    ),
    # nginx limit_req rate=2r/s burst=3 (no nodelay)
    "leaky_bucket": (
        Limit("leaky_bucket", 2, 1, burst=3, delay=True),
        [
            (0.0, 1, (True, 4, 3, 0.0, 0.5, 0.0)),
            (0.0, 1, (True, 4, 2, 0.0, 1.0, 0.5)),
            (0.0, 1, (True, 4, 1, 0.0, 1.5, 1.0)),
            (0.0, 1, (True, 4, 0, 0.0, 2.0, 1.5)),
            (0.0, 1, (False, 4, 0, 0.5, 2.0, 0.0)),
            (0.5, 1, (True, 4, 0, 0.0, 2.0, 1.5)),
        ],
    ),
    # Lyft's counting: a denied request's hits count too, so a free probe after it is denied
    "fixed_window": (
        Limit("fixed_window", 3, 10),
        [
            (12.0, 1, (True, 3, 2, 0.0, 8.0, 0.0)),
            (13.0, 2, (True, 3, 0, 0.0, 7.0, 0.0)),
            (14.0, 1, (False, 3, 0, 6.0, 6.0, 0.0)),
            (14.5, 0, (False, 3, 0, 5.5, 5.5, 0.0)),
            (20.0, 3, (True, 3, 0, 0.0, 10.0, 0.0)),
            (25.0, 4, (False, 3, 0, math.inf, 5.0, 0.0)),
            (26.0, 0, (False, 3, 0, 4.0, 4.0, 0.0)),
        ],
    ),
    # envoyproxy/ratelimit's hits_addend case: 3, 16, 3 on 20/minute -> 22 > 20, nothing left
    "fixed_window-hits-addend": (
        Limit("fixed_window", 20, 60),
        [
            (1.0, 3, (True, 20, 17, 0.0, 59.0, 0.0)),
            (2.0, 16, (True, 20, 1, 0.0, 58.0, 0.0)),
            (3.0, 3, (False, 20, 0, 57.0, 57.0, 0.0)),
            (4.0, 1, (False, 20, 0, 56.0, 56.0, 0.0)),
            (60.0, 20, (True, 20, 0, 0.0, 60.0, 0.0)),
        ],
    ),
    # a limit of 0 counts as well: a probe after a hit is over; the window's reset is reported
    "fixed_window-zero": (
        Limit("fixed_window", 0, 60),
        [
            (30.0, 0, (True, 0, 0, 0.0, 30.0, 0.0)),
            (31.0, 1, (False, 0, 0, math.inf, 29.0, 0.0)),
            (32.0, 0, (False, 0, 0, 28.0, 28.0, 0.0)),
            (61.0, 0, (True, 0, 0, 0.0, 59.0, 0.0)),
        ],
    ),
    # count_denied: false -- only admitted hits count
    "fixed_window_admitted": (
        Limit("fixed_window_admitted", 3, 10),
        [
            (12.0, 1, (True, 3, 2, 0.0, 8.0, 0.0)),
            (13.0, 2, (True, 3, 0, 0.0, 7.0, 0.0)),
            (14.0, 1, (False, 3, 0, 6.0, 6.0, 0.0)),
            (14.5, 0, (True, 3, 0, 0.0, 5.5, 0.0)),
            (20.0, 2, (True, 3, 1, 0.0, 10.0, 0.0)),
            (21.0, 3, (False, 3, 1, 9.0, 9.0, 0.0)),
            (22.0, 1, (True, 3, 0, 0.0, 8.0, 0.0)),
            (25.0, 4, (False, 3, 0, math.inf, 5.0, 0.0)),
        ],
    ),
    "sliding_window_counter": (
        Limit("sliding_window_counter", 10, 60),
        [
            (10.0, 10, (True, 10, 0, 0.0, 110.0, 0.0)),
            (60.0, 1, (False, 10, 0, 6.0, 60.0, 0.0)),
            (90.0, 1, (True, 10, 4, 0.0, 90.0, 0.0)),  # 10 * 0.5 + 1 = 6 -> 4 left
        ],
    ),
    "sliding_window_log": (
        Limit("sliding_window_log", 3, 10),
        [
            (0.0, 1, (True, 3, 2, 0.0, 10.0, 0.0)),
            (1.0, 2, (True, 3, 0, 0.0, 10.0, 0.0)),
            (5.0, 1, (False, 3, 0, 5.0, 6.0, 0.0)),
            (10.0, 1, (True, 3, 0, 0.0, 10.0, 0.0)),
            (10.5, 2, (False, 3, 0, 0.5, 9.5, 0.0)),
            (11.0, 2, (True, 3, 0, 0.0, 10.0, 0.0)),
        ],
    ),
}


@pytest.mark.parametrize("alg", sorted(GOLDEN))
def test_golden_sequences(make_store, alg):
    limit, steps = GOLDEN[alg]

    async def main():
        store = await make_store()
        try:
            for i, (now, cost, want) in enumerate(steps):
                got = await store.hit("golden", limit, cost, now=now)
                assert_same(got, Decision(*want), f"{alg} step {i}")
        finally:
            await store.close()

    arun(main())


@pytest.mark.parametrize("alg", ALGORITHMS)
def test_peek_consumes_nothing(make_store, alg):
    limit = Limit(alg, 2, 10)

    async def main():
        store = await make_store()
        try:
            for _ in range(5):
                d = await store.peek("p", limit, 1, now=50.0)
                assert d.allowed and d.remaining == 1
            assert (await store.hit("p", limit, 2, now=50.0)).allowed
            d = await store.peek("p", limit, 1, now=50.0)
            assert not d.allowed and d.retry_after > 0
        finally:
            await store.close()

    arun(main())


@pytest.mark.parametrize("alg", ALGORITHMS)
def test_limit_zero_and_keys_are_per_limit(make_store, alg):
    a, b = Limit(alg, 1, 60, name="a"), Limit(alg, 1, 60, name="b")

    async def main():
        store = await make_store()
        try:
            assert (await store.hit("k", a, now=10.0)).allowed
            assert not (await store.hit("k", a, now=10.0)).allowed
            assert (await store.hit("k", b, now=10.0)).allowed  # same key, other rule: own state
            d = await store.hit("k", Limit(alg, 0, 60), now=10.0)
            assert (d.allowed, d.remaining, d.retry_after) == (False, 0, math.inf)
        finally:
            await store.close()

    arun(main())


# ================================================================ MemoryStore specifics


def test_memory_store_stays_bounded_under_key_churn():
    limit = Limit("fixed_window", 5, 60)
    store = MemoryStore(max_keys=1000)
    for i in range(10_000):  # an attacker cycling source addresses
        store.hit_sync(f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}", limit, 1, 100.0)
        assert len(store) <= 1000
    assert store.evictions >= 9_000 - 1000


def test_memory_store_keeps_keys_in_use_through_churn():
    """A key used at least once per max_keys/2 new keys is never evicted."""
    limit = Limit("fixed_window", 1000, 3600)
    store = MemoryStore(max_keys=100)
    for i in range(5_000):
        if i % 40 == 0:
            d = store.hit_sync("victim", limit, 1, 10.0)
            assert d.remaining == 1000 - (i // 40 + 1)  # its count was never lost
        store.hit_sync(f"attacker-{i}", limit, 1, 10.0)
        assert len(store) <= 100


def test_memory_store_max_keys_one():
    store = MemoryStore(max_keys=1)
    limit = Limit("token_bucket", 1, 60)
    for i in range(10):
        store.hit_sync(str(i), limit, 1, 0.0)
        assert len(store) == 1


def test_memory_store_hashes_long_keys():
    limit = Limit("fixed_window", 2, 60)
    store = MemoryStore(max_key_length=64)
    long_a, long_b = "a" * 10_000, "a" * 9_999 + "b"
    assert store.hit_sync(long_a, limit, 1, 0.0).remaining == 1
    assert store.hit_sync(long_a, limit, 1, 0.0).remaining == 0  # same long key, same state
    assert store.hit_sync(long_b, limit, 1, 0.0).remaining == 1  # a different one is not confused
    assert store.hit_sync("a" * 64, limit, 1, 0.0).remaining == 1  # at the cap: stored as is
    stored = store.stored_keys()
    assert all(len(k) <= 64 for k in stored)
    assert long_a not in stored and hash_key(long_a) in stored and "a" * 64 in stored
    assert long_a in store  # __contains__ hashes too


def test_memory_store_purges_only_idle_states():
    store = MemoryStore()
    tb, fw, sw = Limit("token_bucket", 1, 1), Limit("fixed_window", 1, 10), Limit("sliding_window_log", 1, 100)
    store.hit_sync("a", tb, 1, 0.0)
    store.hit_sync("b", fw, 1, 0.0)
    store.hit_sync("c", sw, 1, 0.0)
    assert store.purge_idle(now=0.5) == 0
    assert store.purge_idle(now=10.0) == 2  # bucket refilled, window over; the log still holds its entry
    assert len(store) == 1 and "c" in store
    assert not store.hit_sync("c", sw, 1, 10.0).allowed


def test_memory_store_uses_its_clock():
    now = [1000.0]
    store = MemoryStore(clock=lambda: now[0])
    limit = Limit("token_bucket", 1, 1)
    assert store.hit_sync("x", limit).allowed
    assert not store.hit_sync("x", limit).allowed
    now[0] += 1.0
    assert store.hit_sync("x", limit).allowed
    assert arun(store.hit("y", limit)).allowed


def test_memory_store_rejects_negative_cost():
    with pytest.raises(ValueError):
        MemoryStore().hit_sync("x", Limit("fixed_window", 1, 1), -1, 0.0)


@pytest.mark.parametrize(
    "limit",
    [
        Limit("token_bucket", 10, 60),
        Limit("leaky_bucket", 10, 60, delay=True),
        Limit("fixed_window", 100, 60),
        Limit("sliding_window_counter", 100, 60),
    ],
    ids=lambda lim: lim.algorithm,
)
def test_memory_store_costs_at_most_150_bytes_per_key(limit):
    """The memory budget for bucket and counter algorithms, key strings included."""
    import gc
    import tracemalloc

    n = 10_000
    store = MemoryStore(max_keys=n)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(n):
            store.hit_sync(f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}", limit, 1, 1_700_000_000.0 + i * 1e-6)
        per_key = (tracemalloc.get_traced_memory()[0] - before) / n
    finally:
        tracemalloc.stop()
    assert len(store) == n
    assert per_key <= 150, per_key
