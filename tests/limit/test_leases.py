"""Leased quota (http.leases, netlimit/limit/stores/lease.py) against a REAL
redis-server: a hot key is decided from quota reserved in Redis beforehand, never
over the limit in any window, with few round trips (EVALSHA counted by the server);
several processes on one key admit exactly the limit per window; cold keys answer
as without leases; a lease in hand is honoured while Redis is down.

Assertions are on counts (admitted per window, server-counted EVALSHA), never on
timing: a decision's window is the one ending at ``time.time() + reset``."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import redis.asyncio as aioredis

from netlimit.config.validate import load_string
from netlimit.limit import stores
from netlimit.limit.algorithms import FIXED_WINDOW, LEAKY_BUCKET, SLIDING_WINDOW_COUNTER, TOKEN_BUCKET, Limit
from netlimit.limit.limiter import SRC_LOCAL, SRC_STORE, Limiter
from netlimit.limit.metrics import Metrics
from netlimit.limit.request import CheckRequest
from netlimit.limit.rules import from_loaded
from netlimit.limit.stores import LeasedRedisStore, RedisStore
from netlimit.limit.stores import lease as lease_mod

WORKER = Path(__file__).resolve().parents[1] / "helpers" / "lease_worker.py"


def prefix() -> str:
    return f"l{uuid.uuid4().hex[:10]}"


async def evalsha_calls(url: str) -> int:
    r = aioredis.Redis.from_url(url, decode_responses=True)
    try:
        st = await r.info("commandstats")
        return int(st.get("cmdstat_evalsha", {}).get("calls", 0))
    finally:
        await r.aclose()


async def decide(store: LeasedRedisStore, key: str, limit: Limit, cost: int = 1):
    """What the limiter does for a rule that leases (Limiter._hit)."""
    d = store.from_lease(key, limit, cost)
    return d if d is not None else await store.hit_leasing(key, limit, cost)


def window_of(d, period: float) -> int:
    return round((time.time() + d.reset) / period) - 1


def full_windows(adm: Counter, den: Counter) -> list:
    """The windows a run saw whole and drove past the limit: a denial in them, and
    neither the run's first nor its last window (both partial). Each must admit
    exactly the limit (no early denial); a window without a denial only shows the
    host's speed, not the limiter's (a loaded host offers less)."""
    seen = sorted(set(adm) | set(den))
    return [w for w in seen[1:-1] if den[w]]


def test_one_hot_key_never_over_and_few_round_trips(redis_server):
    """One process, one hot key: admitted per window <= the limit, every full
    window admits exactly the limit, and <= 0.05 EVALSHA per decision."""
    limit, period = 1000, 0.5
    lim = Limit("fixed_window", limit, period, name="hot-a")

    async def main():
        store = LeasedRedisStore(redis_server.url, key_prefix=prefix(), timeout_ms=1000)
        adm: Counter[int] = Counter()
        den: Counter[int] = Counter()
        n = 0
        before = await evalsha_calls(redis_server.url)
        # at least 2 s, then on until two whole windows were driven past the limit
        # (bounded: a loaded host offers fewer decisions per window)
        start = time.monotonic()
        try:
            while n < 2_000_000 and time.monotonic() < start + 30:
                d = await decide(store, "k", lim)
                n += 1
                (adm if d.allowed else den)[window_of(d, period)] += 1
                if n % 256 == 0 and time.monotonic() > start + 2 and len(full_windows(adm, den)) >= 2:
                    break
        finally:
            await store.close()
        after = await evalsha_calls(redis_server.url)
        return adm, den, n, after - before, store.lease_stats

    adm, den, n, trips, st = asyncio.run(main())
    print(
        f"decisions {n}, EVALSHA {trips} ({trips / n:.4f} per decision), admitted {dict(adm)}, denied {dict(den)}, {st}"
    )
    assert adm and max(adm.values()) <= limit, adm
    full = full_windows(adm, den)
    assert len(full) >= 2, (adm, den)
    for w in full:
        assert adm[w] == limit, (w, adm, den)
    assert n >= 2000  # enough decisions for the ratio to mean something
    assert trips / n <= 0.05, (trips, n)
    assert st.granted > 0 and st.local > 0


def _run_workers(
    url: str, n: int, limit: int, period: float, total_rate: float, dur: float, alg: str = FIXED_WINDOW
) -> dict[int, list[int]]:
    p = prefix()
    start = time.time() + 1.5  # every process imported and connected before it
    env = dict(os.environ)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                url,
                p,
                str(limit),
                str(period),
                str(total_rate / n),
                str(start),
                str(dur),
                "1",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(n)
    ]
    total: dict[int, list[int]] = {}
    try:
        for pr in procs:
            out, err = pr.communicate(timeout=dur + 60)
            assert pr.returncode == 0, err
            for w, (a, b) in json.loads(out.strip().splitlines()[-1]).items():
                c = total.setdefault(int(w), [0, 0])
                c[0] += a
                c[1] += b
    finally:
        for pr in procs:
            if pr.poll() is None:
                pr.kill()
                pr.wait()
    return total


def test_four_processes_at_twice_the_limit_admit_exactly_the_limit(redis_server):
    limit, period = 1000, 1.0
    total = _run_workers(redis_server.url, 4, limit, period, 2.0 * limit, 4.0)
    print("window: [attempts, admitted]", dict(sorted(total.items())))
    assert total
    for w, (attempts, admitted) in total.items():
        assert admitted <= limit, (w, attempts, admitted)  # never over, in any window
    full = [w for w, (attempts, _) in total.items() if attempts >= 1.5 * limit]
    assert full, total  # the load reached twice the limit in some window
    for w in full:
        assert total[w][1] == limit, (w, total[w])


def test_four_processes_at_nine_tenths_of_the_limit_few_early_denials(redis_server):
    limit, period = 1000, 1.0
    total = _run_workers(redis_server.url, 4, limit, period, 0.9 * limit, 4.0)
    attempts = sum(a for a, _ in total.values())
    denied = sum(a - b for a, b in total.values())
    print(f"0.9x the limit: {attempts} requests, {denied} denied ({100 * denied / max(1, attempts):.2f} %)", total)
    for w, (a, b) in total.items():
        assert b <= limit, (w, a, b)
    assert attempts > 0


def test_cold_keys_answer_as_without_leases(redis_server):
    """A few hits on each of many keys: the same answers as the plain store, one
    EVALSHA per decision, no lease taken."""
    lim = Limit("fixed_window", 2, 60.0, name="cold")
    lim2 = Limit("fixed_window_admitted", 2, 60.0, name="cold2")

    async def main():
        leased = LeasedRedisStore(redis_server.url, key_prefix=prefix())
        plain = RedisStore(redis_server.url, key_prefix=prefix())
        await plain.load_scripts(lim, lim2)  # no NOSCRIPT retry in the count
        before = await evalsha_calls(redis_server.url)
        a, b = [], []
        for i in range(200):
            for limit in (lim, lim2):
                for _ in range(1 + i % 4):  # <= 4 hits: below 50/s over any tick (cold)
                    x = await decide(leased, f"10.0.{i}.1", limit)
                    y = await plain.hit(f"10.0.{i}.1", limit)
                    a.append((x.allowed, x.limit, x.remaining, x.retry_after > 0))
                    b.append((y.allowed, y.limit, y.remaining, y.retry_after > 0))
        after = await evalsha_calls(redis_server.url)
        held = dict(leased._leases)
        await leased.close()
        await plain.close()
        return a, b, after - before, held, leased.lease_stats

    a, b, trips, held, st = asyncio.run(main())
    assert a == b
    assert trips == 2 * len(a)  # one round trip each, leased or not
    assert not held and st.granted == 0


def test_lease_is_honoured_while_redis_is_down_then_on_store_failure(redis_factory, monkeypatch):
    """Through the Limiter: a hot key's lease answers with the store stopped
    (SRC_STORE: it was reserved), exactly its units; then on_store_failure
    (local) decides.  A descriptor with lease: off never leases."""
    monkeypatch.setattr(lease_mod, "LEASE_TTL", 30.0)  # the lease outlives the test's steps
    server = redis_factory()
    cfg = f"""
version: 1
http:
  domain: api
  storage: {server.url}
  leases: on
  descriptors:
    - key: hot
      rate_limit: {{unit: minute, requests_per_unit: 6000, name: hot}}
    - key: off
      rate_limit: {{unit: minute, requests_per_unit: 6000, name: off}}
      lease: off
"""
    loaded = load_string(cfg)
    assert loaded.config.http.leases is True
    rules = from_loaded(loaded)

    async def main():
        store = LeasedRedisStore(server.url, key_prefix=prefix(), timeout_ms=200)
        lim = Limiter(rules, store, on_store_failure="local")
        req = CheckRequest.simple("api", [[("hot", "x")]])
        off = CheckRequest.simple("api", [[("off", "x")]])
        for _ in range(300):
            await lim.check(off)
        assert store.lease_stats.decisions == 0  # lease: off: the one-trip path
        k = None
        for _ in range(2000):
            r = await lim.check(req)
            assert r.statuses[0].source == SRC_STORE
            k = next(iter(store._leases), None)
            if k is not None and store._leases[k].left >= 3:
                break
        assert k is not None, "the hot key never leased"
        left = store._leases[k].left
        text = Metrics(lim).render().decode()  # the lease in hand, per rule (lease: off is no leasing rule)
        assert f'netlimit_http_lease_rule_held_units{{domain="api",rule="hot"}} {float(left)}' in text
        assert 'rule="off"' not in text.split("netlimit_http_lease_rule_held_units", 1)[1].split("# HELP", 1)[0]
        server.stop()
        for _ in range(left):
            r = await lim.check(req)
            assert r.allowed and r.statuses[0].source == SRC_STORE
        r = await lim.check(req)
        assert r.allowed and r.statuses[0].source == SRC_LOCAL  # the lease used up: on_store_failure
        text = Metrics(lim).render().decode()
        st = store.lease_stats
        assert f"netlimit_http_leases_granted_total {float(st.granted)}" in text
        assert f"netlimit_http_lease_round_trips_total {float(st.round_trips)}" in text
        assert 'netlimit_http_lease_units_total{what="granted"}' in text
        assert "netlimit_http_lease_held_units 0.0" in text  # the lease was used up
        assert 'netlimit_http_lease_rule_held_units{domain="api",rule="hot"} 0.0' in text
        ratio = st.round_trips / st.decisions
        assert f"netlimit_http_lease_round_trips_per_decision {ratio!r}" in text
        assert 'netlimit_http_lease_confirms_total{result="unconfirmed"} 0.0' in text  # no replica: no WAIT
        await lim.close()

    asyncio.run(main())


def test_exported():
    assert stores.LeasedRedisStore is LeasedRedisStore


def test_a_key_seen_once_is_only_marked_and_a_repeated_one_counted():
    """The cold path (issue 33): a key's first sight over this tick and the last is a
    mark in a fixed table (nothing kept per key), it is counted from its second sight
    on, and every cold decision is the store's own one-trip coroutine (no extra level)."""
    lim = Limit("fixed_window", 100, 60.0, name="marks")

    async def main():
        store = LeasedRedisStore("redis://127.0.0.1:1/0", key_prefix=prefix())
        store._lean = True  # the store's own client, as a lean URL gets
        calls = []

        async def one_trip(key, limit, cost=1):
            calls.append(key)
            return key

        store.hit = one_trip  # type: ignore[method-assign]
        keys = [f"10.1.{i >> 8}.{i & 255}" for i in range(5000)]
        for k in keys:
            c = store.hit_leasing(k, lim, 1)
            assert c.cr_code is one_trip.__code__  # RedisStore.hit's coroutine itself
            assert await c == k
        tracked_once = dict(store._cur)
        for _ in range(3):
            assert await store.hit_leasing("hot", lim, 1) == "hot"
        st = store.lease_stats
        out = (tracked_once, store._cur.get(lim._ns + "hot"), calls, st.decisions, st.round_trips, st.granted)
        store._stop_clock()
        return out

    tracked_once, hot_count, calls, decisions, trips, granted = asyncio.run(main())
    # 5000 first sights in 2**18 slots: ~48 share a slot with an earlier one (expected
    # 5000**2 / 2 / 2**18; such a key is counted from its first sight, once)
    assert len(tracked_once) <= 200 and all(n == 1 for n in tracked_once.values()), tracked_once
    assert hot_count == 2  # three sights: the first marked, the next two counted
    assert len(calls) == 5003 and decisions == trips == 5003 and granted == 0


def test_a_key_counted_from_its_second_sight_goes_hot_and_leases(redis_server):
    """A key decided back to back leases after its sixth sight at most (five counted
    within a tick: HOT_RATE * TICK), the ones before go the one-trip way."""
    lim = Limit("fixed_window", 10_000, 60.0, name="goes-hot")

    async def main():
        store = LeasedRedisStore(redis_server.url, key_prefix=prefix())
        try:
            n = 0
            while store.lease_stats.granted == 0 and n < 1000:
                await decide(store, "k", lim)
                n += 1
            return n
        finally:
            await store.close()

    n = asyncio.run(main())
    assert 6 <= n <= 100, n  # >= 6: the first sight is not counted; a loaded host may stretch the tick


def test_concurrent_clients_on_one_hot_key_share_one_renewal(redis_server):
    """64 concurrent decisions on one hot key: never over the limit in a window,
    and the renewals are not one per waiting client."""
    limit, period = 500, 0.5
    lim = Limit("fixed_window", limit, period, name="hot-conc")

    async def main():
        store = LeasedRedisStore(redis_server.url, key_prefix=prefix(), timeout_ms=1000)
        adm: Counter[int] = Counter()
        n = 0
        end = time.monotonic() + 1.5

        async def client():
            nonlocal n
            while time.monotonic() < end:
                d = await decide(store, "k", lim)
                n += 1
                if d.allowed:
                    adm[window_of(d, period)] += 1

        try:
            await asyncio.gather(*(client() for _ in range(64)))
        finally:
            await store.close()
        return adm, n, store.lease_stats

    adm, n, st = asyncio.run(main())
    print(f"64 clients: {n} decisions, admitted per window {dict(adm)}, {st}")
    assert adm and max(adm.values()) <= limit, adm
    assert st.granted > 0 and st.round_trips <= n // 4, st


def test_buckets_lease_and_never_admit_more_than_the_bucket_allows(redis_server):
    """token_bucket and leaky_bucket (no delay), one hot key far above its rate: the
    admissions of the run are at most burst + rate x its duration (the bucket's own
    bound), and most decisions make no round trip."""

    async def one(alg: str):
        lim = Limit(alg, 1000, 1.0, burst=200, name=f"hot-{alg}")
        store = LeasedRedisStore(redis_server.url, key_prefix=prefix(), timeout_ms=1000)
        admitted = n = 0
        t0 = time.monotonic()
        end = t0 + 1.5
        try:
            while time.monotonic() < end:
                d = await decide(store, "k", lim)
                n += 1
                admitted += d.allowed
        finally:
            el = time.monotonic() - t0
            await store.close()
        return admitted, n, el, store.lease_stats

    for alg in (TOKEN_BUCKET, LEAKY_BUCKET):
        admitted, n, el, st = asyncio.run(one(alg))
        print(f"{alg}: {admitted} admitted of {n} in {el:.2f}s, {st}")
        assert admitted <= 200 + 1000 * el, (alg, admitted, el)
        assert admitted >= 200 and st.granted > 0 and st.local > 0, (alg, st)


def test_four_processes_token_bucket_at_twice_the_rate(redis_server):
    total = _run_workers(redis_server.url, 4, 1000, 1.0, 2000.0, 3.0, TOKEN_BUCKET)
    admitted = sum(b for _, b in total.values())
    attempts = sum(a for a, _ in total.values())
    print(f"token bucket, 4 processes at 2x: {admitted} admitted of {attempts}")
    # the bucket starts full (burst = limit = 1000) and refills 1000/s; the workers
    # run 3 s (plus scheduling: a second more at most is allowed for)
    assert admitted <= 1000 + 1000 * 4.0, admitted
    assert attempts > admitted


def test_leases_on_a_redis_cluster(redis_cluster):
    """The same lease calls through a 3-primary cluster (the key's slot owner; no
    failover here): never over the limit, exactly the limit in full windows, few
    round trips, for four hot keys (on the primaries owning their slots)."""
    limit, period = 500, 0.5
    lim = Limit(FIXED_WINDOW, limit, period, name="hot-cluster")
    KEYS = ("a", "b", "c", "d")

    async def main():
        store = LeasedRedisStore(redis_cluster.url, key_prefix=prefix(), timeout_ms=2000)
        await store.start()
        adm = {key: Counter[int]() for key in KEYS}
        den = {key: Counter[int]() for key in KEYS}
        n = 0
        # at least 1.6 s, then on until every key had a whole window driven past the
        # limit (bounded: a loaded host offers fewer decisions per window)
        start = time.monotonic()
        try:
            while time.monotonic() < start + 30:
                for key in KEYS:
                    d = await decide(store, key, lim)
                    n += 1
                    (adm if d.allowed else den)[key][window_of(d, period)] += 1
                if n % 256 == 0 and time.monotonic() > start + 1.6:
                    if all(full_windows(adm[k], den[k]) for k in KEYS):
                        break
        finally:
            await store.close()
        return adm, den, n, store.lease_stats

    adm, den, n, st = asyncio.run(main())
    print(f"cluster: {n} decisions, {st.round_trips} round trips, admitted {adm}, denied {den}, {st}")
    for key in KEYS:
        assert adm[key] and max(adm[key].values()) <= limit, (key, adm[key])
        full = full_windows(adm[key], den[key])
        assert full, (key, adm[key], den[key])
        for w in full:
            assert adm[key][w] == limit, (key, w, adm[key], den[key])
    # a replica that did not confirm within its time (a loaded host) sets its primary
    # aside for UNCONFIRMED_S: its keys take the one-trip path meanwhile (safe, slower)
    assert st.round_trips <= (0.05 if not st.unconfirmed else 0.5) * n, st


def test_sliding_window_counter_leases_and_stays_within_each_window(redis_server):
    """sliding_window_counter, one hot key far above its limit: every fixed window
    of the counter admits at most the limit (its current count never passes it),
    with few round trips."""
    limit, period = 1000, 0.5
    lim = Limit(SLIDING_WINDOW_COUNTER, limit, period, name="hot-swc")

    async def main():
        store = LeasedRedisStore(redis_server.url, key_prefix=prefix(), timeout_ms=1000)
        adm: Counter[int] = Counter()
        n = 0
        end = time.monotonic() + 2.0
        try:
            while time.monotonic() < end:
                d = await decide(store, "k", lim)
                n += 1
                if d.allowed:  # reset runs to the end of the window after the decision's
                    adm[round((time.time() + d.reset) / period) - 2] += 1
        finally:
            await store.close()
        return adm, n, store.lease_stats

    adm, n, st = asyncio.run(main())
    print(f"sliding_window_counter: {n} decisions, admitted per window {dict(adm)}, {st}")
    assert adm and max(adm.values()) <= limit, adm
    assert st.granted > 0 and st.round_trips <= 0.05 * n, st


def test_a_lease_reports_what_the_store_reports(redis_server):
    """Decisions from a lease carry the limit the store reports (the burst for a
    bucket), a remaining never above the store's last answer, and a reset > 0."""
    lim = Limit(TOKEN_BUCKET, 1000, 1.0, burst=300, name="hot-report")

    async def main():
        store = LeasedRedisStore(redis_server.url, key_prefix=prefix(), timeout_ms=1000)
        try:
            last = None
            local = []
            for _ in range(400):
                d = store.from_lease("k", lim, 1)
                if d is None:
                    last = await store.hit_leasing("k", lim, 1)
                elif d.allowed and last is not None:
                    local.append((d, last))
            return local
        finally:
            await store.close()

    local = asyncio.run(main())
    assert local
    for d, last in local:
        assert d.limit == 300 and d.remaining <= last.remaining and d.reset >= 0


def test_a_quiet_process_gives_back_its_lease_without_another_decision(redis_server):
    """A hot key's lease, then no decision at all: the idle sweep gives the unused units
    back once the lease's time is over, so another process is admitted them (before the
    idle sweep, they stayed counted until this process's next decision, for a day's
    window: early denials for everybody else)."""
    limit = 1000
    lim = Limit("fixed_window", limit, 86_400, name="quiet-a")
    pre = prefix()

    async def main():
        a = LeasedRedisStore(redis_server.url, key_prefix=pre, timeout_ms=1000)
        b = RedisStore(redis_server.url, key_prefix=pre, timeout_ms=1000)
        try:
            admitted = n = 0
            # hot in `a`: leases; 400 decisions, then on until a lease holds units (the last
            # one may have been used up by the 400th: a slow host leases a few at a time)
            while n < 400 or (not a.held() and n < 800):
                admitted += (await decide(a, "k", lim)).allowed
                n += 1
            assert a.held() > 0 and a.lease_stats.granted > 0, a.lease_stats
            deadline = time.monotonic() + 10
            while a.held() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)  # the poll's interval: `a` makes no decision meanwhile
            held = a.held()
            d = await b.hit("k", lim, limit - admitted)  # another process takes exactly the rest
            return n, admitted, held, d.allowed, a.lease_stats
        finally:
            await a.close()
            await b.close()

    n, admitted, held, rest_allowed, st = asyncio.run(main())
    assert admitted == n, (admitted, n)  # under the limit: every one
    assert held == 0 and st.returned_units > 0, st
    assert rest_allowed, (admitted, st)
