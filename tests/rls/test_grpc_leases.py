"""The Envoy RLS gRPC door with leases on (http.leases, stores/lease.py), real
gRPC server and client on loopback, a real redis-server: one hot descriptor at a
high rate is decided from leases (EVALSHA counted by the server), admits exactly
the limit in its window, ``limitRemaining`` is never more than the shared
remaining minus what leases hold, ``durationUntilReset`` is the window's end.

A response's window is the one ending at ``time.time() + durationUntilReset``
(whole seconds of an hour's window: the nearest hour mark)."""

from __future__ import annotations

import asyncio
import math
import textwrap
import time
import uuid
from collections import Counter

import redis.asyncio as aioredis
from rls_helpers import OK, serving

from netlimit.config.validate import load_string
from netlimit.limit.limiter import Limiter
from netlimit.limit.rules import from_loaded
from netlimit.limit.stores import LeasedRedisStore

LIMIT = 3000
CONFIG = f"""
version: 1
http:
  domain: edge
  leases: on
  descriptors:
    - key: path
      rate_limit: {{unit: hour, requests_per_unit: {LIMIT}, name: hot-path}}
"""
HOT = [("path", "/api")]


async def evalsha_calls(url: str) -> int:
    r = aioredis.Redis.from_url(url, decode_responses=True)
    try:
        st = await r.info("commandstats")
        return int(st.get("cmdstat_evalsha", {}).get("calls", 0))
    finally:
        await r.aclose()


def window(resp) -> int:
    return round((time.time() + resp.statuses[0].duration_until_reset.seconds) / 3600)


def test_grpc_door_hot_descriptor_leases_exactly_the_limit(redis_server):
    loaded = load_string(textwrap.dedent(CONFIG), "edge.yaml")
    rules = from_loaded(loaded)
    store = LeasedRedisStore(redis_server.url, timeout_ms=1000, key_prefix=f"g{uuid.uuid4().hex[:10]}")
    limiter = Limiter(rules, store, on_store_failure="closed")

    async def main():
        adm: Counter[int] = Counter()
        bad_remaining: list[tuple[int, int, int, int]] = []
        bad_reset: list[tuple[float, int, float]] = []
        async with serving(limiter) as run:
            await store.load_scripts(rules.rules[0].limit)
            # 1. one client, in order: every answer's limitRemaining against what is
            #    admitted and held (this process is the only sidecar on the key)
            for _ in range(600):
                t_sent = time.time()
                r = await run.call("edge", HOT)
                t_recv = time.time()
                st = r.statuses[0]
                if r.overall_code != OK:
                    continue
                adm[window(r)] += 1
                admitted = sum(adm.values())
                shared_left = LIMIT - admitted - store.held()  # the shared remaining minus what leases hold
                if st.limit_remaining > shared_left:
                    bad_remaining.append((st.limit_remaining, shared_left, admitted, store.held()))
                end = (math.floor(t_sent / 3600) + 1) * 3600  # the hour's window ends at the next hour mark
                secs = st.duration_until_reset.seconds
                if not (end - t_recv - 1 <= secs <= end - t_sent + 1):
                    bad_reset.append((t_sent, secs, end))
            local_1 = store.lease_stats.local
            # 2. 16 clients as fast as they can until the window's limit is reached
            before = await evalsha_calls(redis_server.url)
            n = 0
            deadline = time.monotonic() + 60

            async def client():
                nonlocal n
                while sum(adm.values()) < LIMIT and time.monotonic() < deadline:
                    r = await run.call("edge", HOT)
                    n += 1
                    if r.overall_code == OK:
                        adm[window(r)] += 1

            await asyncio.gather(*(client() for _ in range(16)))
            trips = await evalsha_calls(redis_server.url) - before
            # 3. past the limit: denied, from the remembered denial (no round trip)
            over = [await run.call("edge", HOT) for _ in range(200)]
        return adm, bad_remaining, bad_reset, local_1, n, trips, over, store.lease_stats

    adm, bad_remaining, bad_reset, local_1, n, trips, over, st = asyncio.run(main())
    print(
        f"gRPC door, leases on: admitted per hour window {dict(adm)}; {n} concurrent decisions, "
        f"{trips} EVALSHA ({trips / max(1, n):.4f} per decision); {st}"
    )
    assert local_1 > 0, "the hot descriptor never leased through gRPC"
    assert bad_remaining == [], bad_remaining[:5]
    assert bad_reset == [], bad_reset[:5]
    assert max(adm.values()) <= LIMIT, adm
    assert max(adm.values()) == LIMIT, adm  # the window that reached it admitted exactly the limit
    assert n >= 1000 and trips / n <= 0.1, (trips, n)
    if len(adm) == 1:  # the run stayed in one hour's window: it is over its limit now
        assert all(r.overall_code != OK and r.statuses[0].limit_remaining == 0 for r in over)
