"""Distinct limit overrides cost a bounded amount (issue 29, item 8): each one
used to compile a Limit (registered for good), a Lua script kept in the process
and one more script cached by Redis -- 30k overrides, +160 MiB and 26,948
scripts.  Now an override is a DynamicLimit: one script per algorithm with the
numbers as arguments, nothing registered, the override rules in an LRU.
Measured on a real redis-server of its own (its script cache starts empty).
The RSS figure for 30k overrides through a real sidecar: bench/overrides_rss.py."""

from __future__ import annotations

import asyncio
import textwrap
import uuid

import redis

from netlimit.config.validate import load_string
from netlimit.limit.algorithms import base
from netlimit.limit.limiter import _OVERRIDE_CACHE_MAX, OK, OVER_LIMIT, Limiter
from netlimit.limit.request import DescriptorIn, Override, build_request
from netlimit.limit.rules import from_loaded
from netlimit.limit.stores import MemoryStore, RedisStore
from netlimit.limit.stores import redis as redis_store

CONFIG = textwrap.dedent("""\
    version: 1
    http:
      domain: api
      descriptors:
        - key: fw
          rate_limit: {unit: minute, requests_per_unit: 100}
        - key: tb
          algorithm: token_bucket
          rate_limit: {unit: minute, requests_per_unit: 100}
        - key: lb
          algorithm: leaky_bucket
          delay: true
          rate_limit: {unit: minute, requests_per_unit: 100}
        - key: swl
          algorithm: sliding_window_log
          rate_limit: {unit: minute, requests_per_unit: 100}
        - key: swc
          algorithm: sliding_window_counter
          rate_limit: {unit: minute, requests_per_unit: 100}
    """)
KEYS = ("fw", "tb", "lb", "swl", "swc")
N = 3000


def _req(i: int, rpu: int, value: str = "c"):
    return build_request("api", [DescriptorIn([(KEYS[i % 5], value)], override=Override("hour", rpu))])


def test_distinct_overrides_keep_redis_scripts_and_process_caches_bounded(redis_factory):
    server = redis_factory()

    async def go():
        store = RedisStore(server.url, timeout_ms=2000, key_prefix=f"nlov-{uuid.uuid4().hex[:8]}")
        lim = Limiter(from_loaded(load_string(CONFIG, "ov.yaml")), store)
        try:
            ns0, lua0 = len(base._NS_BY_SIG), len(redis_store._LIMIT_LUA)
            for i in range(N):
                r = await lim.check(_req(i, 1000 + i))
                assert r.code == OK and r.statuses[0].rule.requests_per_unit == 1000 + i
            # nothing per override outside the bounded LRU
            assert len(base._NS_BY_SIG) == ns0
            assert len(redis_store._LIMIT_LUA) <= lua0 + 5
            assert len(store._lean_args) == 0
            assert len(lim._ov_cache) == _OVERRIDE_CACHE_MAX
            # the overrides still limit, with Redis' counts: 2 per hour, per algorithm
            # (the leaky bucket in queue mode holds one more, delayed)
            for k in range(5):
                n = 3 if KEYS[k] == "lb" else 2
                codes = [(await lim.check(_req(k, 2, "tight"))).code for _ in range(n + 1)]
                assert codes == [OK] * n + [OVER_LIMIT], (KEYS[k], codes)
        finally:
            await lim.close()

    asyncio.run(go())
    info = redis.Redis(port=server.port).info("memory")
    assert 1 <= info["number_of_cached_scripts"] <= 20, info["number_of_cached_scripts"]


def test_the_override_cache_drops_the_least_recently_used():
    async def go():
        lim = Limiter(from_loaded(load_string(CONFIG, "ov.yaml")), MemoryStore())
        hot = _req(0, 7, "hot")
        await lim.check(hot)
        first = next(iter(lim._ov_cache.values()))
        for i in range(2 * _OVERRIDE_CACHE_MAX):
            await lim.check(_req(i, 5000 + i))
            await lim.check(hot)  # used all along: never the least recently used
        assert len(lim._ov_cache) == _OVERRIDE_CACHE_MAX
        assert any(r is first for r in lim._ov_cache.values())
        await lim.close()

    asyncio.run(go())
