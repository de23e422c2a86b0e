"""Every leasing algorithm with leases on (stores/lease.py), on one REAL
redis-server and on the REAL 3-primary cluster: three stores (three sidecars)
decide one hot key from 4 concurrent clients each, far above its limit, on the
server's clock; the admissions never pass the algorithm's bound: at most the limit
in any window (the fixed windows, each fixed window of the sliding counter), at
most ``burst + rate x elapsed`` plus the quota the leases may hold (the buckets:
docs/performance.md, "The buckets").  The exact answers case by case, with an
injected clock, are tests/limit/test_conformance.py (leases need the server's
clock)."""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections import Counter

import pytest

from netlimit.limit.algorithms import (
    FIXED_WINDOW,
    FIXED_WINDOW_ADMITTED,
    LEAKY_BUCKET,
    SLIDING_WINDOW_COUNTER,
    TOKEN_BUCKET,
    Limit,
)
from netlimit.limit.stores import LeasedRedisStore, StoreError
from netlimit.limit.stores import lease as lease_mod

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

STORES, CLIENTS, SECONDS = 3, 4, 1.2
LIMITS = {
    FIXED_WINDOW: Limit(FIXED_WINDOW, 400, 0.5, name="conf-fw"),
    FIXED_WINDOW_ADMITTED: Limit(FIXED_WINDOW_ADMITTED, 400, 0.5, name="conf-fwa"),
    SLIDING_WINDOW_COUNTER: Limit(SLIDING_WINDOW_COUNTER, 400, 0.5, name="conf-swc"),
    TOKEN_BUCKET: Limit(TOKEN_BUCKET, 400, 1.0, burst=100, name="conf-tb"),
    LEAKY_BUCKET: Limit(LEAKY_BUCKET, 400, 1.0, burst=100, name="conf-lb"),
}
# the window a decision's reset points past: its own for the fixed windows; the
# sliding counter's reset of an admission is the end of the window after it
AHEAD = {FIXED_WINDOW: 1, FIXED_WINDOW_ADMITTED: 1, SLIDING_WINDOW_COUNTER: 2}


@pytest.fixture(params=["redis", "cluster"])
def url(request):
    return request.getfixturevalue("redis_server" if request.param == "redis" else "redis_cluster").url


@pytest.mark.parametrize("alg", list(LIMITS))
def test_leasing_algorithm_never_over_its_bound(url, alg):
    lim = LIMITS[alg]
    prefix = f"lc{uuid.uuid4().hex[:10]}"

    async def main():
        stores = [LeasedRedisStore(url, key_prefix=prefix, timeout_ms=2000) for _ in range(STORES)]
        for s in stores:
            await s.start()
        adm: Counter[int] = Counter()
        total = errors = 0
        t0 = time.monotonic()
        end = t0 + SECONDS

        async def client(store: LeasedRedisStore) -> None:
            nonlocal total, errors
            n = 0
            while time.monotonic() < end:
                d = store.from_lease("hot", lim, 1)
                if d is None:
                    try:
                        d = await store.hit_leasing("hot", lim, 1)
                    except StoreError:  # a loaded host's timeout: denied (on_store_failure closed)
                        errors += 1
                        continue
                n += 1
                if n % 64 == 0:
                    await asyncio.sleep(0)  # the other clients and the stores' tasks run too
                if d.allowed:
                    total += 1
                    if alg in AHEAD:
                        adm[round((time.time() + d.reset) / lim.period) - AHEAD[alg]] += 1

        try:
            await asyncio.gather(*(client(s) for s in stores for _ in range(CLIENTS)))
        finally:
            elapsed = time.monotonic() - t0
            for s in stores:
                await s.close()
        return adm, total, errors, elapsed, [s.lease_stats for s in stores]

    adm, total, errors, elapsed, stats = asyncio.run(main())
    local = sum(st.local for st in stats)
    print(f"{alg}: admitted {total} in {elapsed:.2f} s, per window {dict(sorted(adm.items()))}, "
          f"{local} decisions from leases, {errors} store errors")  # fmt: skip
    assert local > 0 and sum(st.granted for st in stats) > 0, "no lease was used"
    if alg in AHEAD:
        assert adm and max(adm.values()) <= lim.limit, adm
    else:
        # the bucket's own bound over the run, plus what the leases may hold unused
        # when it starts (spent later than reserved): <= LEASE_FRACTION of the burst each
        held = STORES * max(1, math.floor(lim.burst * lease_mod.LEASE_FRACTION))
        assert total <= lim.burst + lim.limit / lim.period * elapsed + held, (total, elapsed)
        assert total >= lim.burst  # the full bucket at least
