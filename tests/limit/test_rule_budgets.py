"""Per-rule memory budgets (issue 29, item 2): in the memory store a limit's new
keys only ever evict that limit's states (hypothesis over insertion sequences);
how the Limiter splits http.max_keys; Redis' maxmemory-policy is checked at start."""

from __future__ import annotations

import asyncio
import textwrap
import uuid

import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from netlimit.config.validate import load_string
from netlimit.limit.algorithms import Limit
from netlimit.limit.limiter import OVERRIDES, Limiter, rule_budgets
from netlimit.limit.rules import from_loaded
from netlimit.limit.stores import MemoryStore, RedisStore

A = Limit("fixed_window", 5, 60, name="budget-a")
B = Limit("token_bucket", 5, 60, name="budget-b")


@settings(max_examples=150, deadline=None)
@given(
    budget_a=st.integers(1, 20),
    budget_b=st.integers(1, 20),
    ops=st.lists(st.tuples(st.booleans(), st.integers(0, 60)), max_size=300),
)
def test_a_limits_keys_evict_only_its_own_states(budget_a, budget_b, ops):
    store = MemoryStore(max_keys=1000, clock=lambda: 1000.0)
    store.set_budgets({A._ns: budget_a, B._ns: budget_b})
    a_keys: list[str] = []
    for is_a, k in ops:
        lim = A if is_a else B
        key = f"{'a' if is_a else 'b'}{k}"
        before_other = {x for x in store.stored_keys() if x[0] != key[0]}
        store.hit_sync(key, lim)
        after_other = {x for x in store.stored_keys() if x[0] != key[0]}
        assert before_other == after_other  # nothing of the other limit moved
        if is_a and key not in a_keys:
            a_keys.append(key)
        n_a = sum(1 for x in store.stored_keys() if x[0] == "a")
        n_b = sum(1 for x in store.stored_keys() if x[0] == "b")
        assert n_a <= budget_a and n_b <= budget_b
    # the evictions are counted per limit
    assert store.evictions == sum(store.evicted.values())


def test_the_most_recent_half_budget_is_always_kept():
    store = MemoryStore(max_keys=1000, clock=lambda: 1000.0)
    store.set_budgets({A._ns: 100})
    for i in range(1000):
        store.hit_sync(f"k{i}", A)
        recent = [f"k{j}" for j in range(max(0, i - 49), i + 1)]
        assert all(k in store for k in recent)
    assert store.evicted[A._ns] >= 1000 - 100


CONFIG = textwrap.dedent("""\
    version: 1
    http:
      domain: api
      max_keys: 1000
      descriptors:
        - key: a
          rate_limit: {unit: minute, requests_per_unit: 5, name: ra}
        - key: b
          rate_limit: {unit: minute, requests_per_unit: 5, name: rb}
        - key: c
          max_keys: 5000
          rate_limit: {unit: minute, requests_per_unit: 5, name: rc}
        - key: free
          unlimited: true
    """)


def test_max_keys_is_split_evenly_and_a_descriptor_may_set_its_own():
    rs = from_loaded(load_string(CONFIG, "b.yaml"))
    budgets, share, names = rule_budgets(rs)
    by_name = {names[ns][1]: n for ns, n in budgets.items()}
    # ra, rb and the overrides share 1000; rc has its own 5000; unlimited rules have none
    assert by_name == {"ra": 333, "rb": 333, "rc": 5000}
    assert share == 333
    lim = Limiter(rs)
    assert lim.store.budget(rs.rules[0].limit._ns) == 333
    assert lim.store.budget("~fwm:") == 333  # the overrides' pool
    ev = lim.evictions()
    assert ev == {("api", "ra"): 0, ("api", "rb"): 0, ("api", "rc"): 0}
    lim.store.evicted["~fwm:"] = 3
    assert lim.evictions()[("api", OVERRIDES)] == 3


def test_a_reload_drops_the_states_of_rules_no_longer_there():
    rs = from_loaded(load_string(CONFIG, "b.yaml"))
    lim = Limiter(rs)
    mem = lim.store
    for r in [r for r in rs.rules if r.limit is not None]:
        mem.hit_sync(rs.store_key(r, [(r.keys[0], "x")]), r.limit)
    assert len(mem) == 3
    rs2 = from_loaded(
        load_string(CONFIG.replace("requests_per_unit: 5, name: rb", "requests_per_unit: 6, name: rb"), "b.yaml")
    )
    lim.set_rules(rs2)
    assert len(mem) == 2  # rb changed: a new limit, its old states unreachable and dropped


def test_redis_eviction_policy_is_checked_at_start(redis_factory, caplog):
    server = redis_factory()

    async def start() -> None:
        store = RedisStore(server.url, key_prefix=f"nlb-{uuid.uuid4().hex[:8]}")
        await store.start()
        await store.close()

    with caplog.at_level("WARNING", logger="netlimit.limit"):
        asyncio.run(start())
    assert not [r for r in caplog.records if "maxmemory-policy" in r.getMessage()]
    redis.Redis(port=server.port).config_set("maxmemory-policy", "allkeys-lru")
    caplog.clear()
    with caplog.at_level("WARNING", logger="netlimit.limit"):
        asyncio.run(start())
    msgs = [r.getMessage() for r in caplog.records if "maxmemory-policy" in r.getMessage()]
    assert len(msgs) == 1
    assert "maxmemory-policy is allkeys-lru" in msgs[0] and "fresh limit" in msgs[0]
