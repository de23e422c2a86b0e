"""Leased quota on a REAL Redis Cluster (3 primaries + 3 replicas) while the hot
key's slot changes hands: (a) resharded to another primary mid-lease (CLUSTER
SETSLOT IMPORTING/MIGRATING, MIGRATE, SETSLOT NODE, as ``redis-cli --cluster
reshard`` does) and (b) its primary killed mid-lease (the replica promoted).
Several stores (one per sidecar) decide one hot key; the admitted count never
passes the limit in any window, a lease in hand is honoured to its end after the
kill and then the store's failure decides (the limiter's on_store_failure).

A decision's window is the one ending at ``time.time() + reset`` (the servers
and this process read one clock); assertions are on counts and on the order of
events, never on how long something took."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import pytest
from redis_cluster import RedisCluster, wait_role

from netlimit.limit.algorithms import FIXED_WINDOW, Limit
from netlimit.limit.stores import LeasedRedisStore, StoreError
from netlimit.limit.stores import lease as lease_mod
from netlimit.limit.stores.cluster import key_slot

pytestmark = [pytest.mark.redis, pytest.mark.timeout(240)]

KEY = "hot"


@dataclass
class Log:
    """Every decision: (monotonic time, window, source, admitted, store index, units
    the store was granted in leases so far); source: lease (from a lease in hand),
    store (a Redis call answered), failure (the call failed: on_store_failure closed
    denies it)."""

    rows: list[tuple[float, int, str, bool, int, int]] = field(default_factory=list)

    def admitted_per_window(self) -> Counter[int]:
        return Counter(r[1] for r in self.rows if r[3])


async def _drive(store: LeasedRedisStore, i: int, lim: Limit, rate: float, log: Log, stop: asyncio.Event) -> None:
    """One sidecar's decisions on KEY at ``rate`` per second until ``stop``."""
    t0 = time.monotonic()
    n = 0
    last_w = 0
    while not stop.is_set():
        if n >= (time.monotonic() - t0) * rate:
            await asyncio.sleep(0.002)
            continue
        n += 1
        d = store.from_lease(KEY, lim, 1)
        src = "lease"
        if d is None:
            src = "store"
            try:
                d = await store.hit_leasing(KEY, lim, 1)
            except StoreError:
                log.rows.append((time.monotonic(), last_w, "failure", False, i, store.lease_stats.granted_units))
                continue
        last_w = round((time.time() + d.reset) / lim.period) - 1
        log.rows.append((time.monotonic(), last_w, src, d.allowed, i, store.lease_stats.granted_units))


def _stores(url: str, n: int, prefix: str) -> list[LeasedRedisStore]:
    return [LeasedRedisStore(url, key_prefix=prefix, timeout_ms=300) for _ in range(n)]


def test_leases_survive_a_reshard_of_the_hot_key_slot_mid_lease(redis_cluster):
    """Three stores on one hot key at about twice its limit; its slot is moved to
    another primary while they hold leases (ASK while migrating, MOVED after):
    never over the limit in any window, and leases go on from the new owner."""
    limit, period = 300, 1.0
    lim = Limit(FIXED_WINDOW, limit, period, name="reshard-hot")
    prefix = f"r{uuid.uuid4().hex[:10]}"

    async def main():
        stores = _stores(redis_cluster.url, 3, prefix)
        for s in stores:
            await s.start()
        rkey = stores[0].redis_keys(KEY, lim)[0]
        slot = key_slot(rkey.encode())
        shards = redis_cluster.shards()
        src = next(s for s in shards if s.owns(slot)).primary
        dst = next(s for s in shards if not s.owns(slot)).primary
        src_id, dst_id = redis_cluster.node_id(src), redis_cluster.node_id(dst)
        log, stop = Log(), asyncio.Event()
        tasks = [asyncio.create_task(_drive(s, i, lim, 2.0 * limit / 3, log, stop)) for i, s in enumerate(stores)]
        marks = {}
        try:
            await asyncio.sleep(1.2)
            granted0 = sum(s.lease_stats.granted for s in stores)
            await asyncio.to_thread(dst.call, "CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
            await asyncio.to_thread(src.call, "CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
            marks["migrating"] = time.monotonic()
            await asyncio.sleep(0.5)
            keys = await asyncio.to_thread(src.call, "CLUSTER", "GETKEYSINSLOT", slot, 1000)
            if keys:
                await asyncio.to_thread(src.call, "MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS", *keys)
            marks["migrated"] = time.monotonic()
            await asyncio.sleep(0.5)
            for node in (dst, src, *[s.primary for s in shards if s.primary not in (src, dst)]):
                await asyncio.to_thread(node.call, "CLUSTER", "SETSLOT", slot, "NODE", dst_id)
            marks["moved"] = time.monotonic()
            granted1 = sum(s.lease_stats.granted for s in stores)
            await asyncio.sleep(1.5)
        finally:
            stop.set()
            await asyncio.gather(*tasks)
            for s in stores:
                await s.close()
        on_dst = await asyncio.to_thread(dst.call, "EXISTS", rkey)
        return log, marks, stores, granted0, granted1, on_dst

    log, marks, stores, granted0, granted1, on_dst = asyncio.run(main())
    adm = log.admitted_per_window()
    redirects = Counter()
    for s in stores:
        redirects.update(s.stats.redirects)
    granted = sum(s.lease_stats.granted for s in stores)
    failures = sum(1 for r in log.rows if r[2] == "failure")
    print(
        f"reshard: {len(log.rows)} decisions, admitted per window {dict(sorted(adm.items()))}, "
        f"redirects {dict(redirects)}, leases granted {granted0} before / {granted1} by the move / {granted} "
        f"in all, {failures} failed calls"
    )
    assert adm and max(adm.values()) <= limit, adm  # never over, in any window
    assert granted0 > 0, "no lease before the reshard"
    assert redirects["ask"] >= 1 and redirects["moved"] >= 1, redirects
    assert granted > granted1, "no lease granted by the new owner after the move"
    assert on_dst == 1  # the count (with its reservations) lives on the new owner
    after = [r for r in log.rows if r[0] > marks["moved"] and r[2] == "lease"]
    assert after, "no decision from a lease after the move"


def test_leases_through_a_killed_primary_never_over_the_limit(tmp_path):
    """Three stores on one hot key; its primary is killed (SIGKILL) while they hold
    leases, its replica is promoted.  A lease call that admitted is confirmed on the
    replica (WAIT) before it is used, so the promoted replica counts every unit
    admitted: never over the limit in any window (the kill's window reaches its
    limit after the promotion).  After the kill the leases in hand are answered,
    at most their units, until their time ends; then the calls fail (the
    limiter's on_store_failure) until the promotion."""
    limit, period = 4500, 20.0
    lim = Limit(FIXED_WINDOW, limit, period, name="failover-hot")
    prefix = f"f{uuid.uuid4().hex[:10]}"
    with RedisCluster(tmp_path, node_timeout_ms=1000, full_coverage=False) as cluster:

        async def main():
            stores = _stores(cluster.url, 3, prefix)
            for s in stores:
                await s.start()
            slot = key_slot(stores[0].redis_keys(KEY, lim)[0].encode())
            victim = cluster.shard_of(slot)
            # start early in a window: the kill's window outlives the failover
            deadline = time.monotonic() + 2 * period
            while not (0.2 <= time.time() % period < 0.6) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            log, stop = Log(), asyncio.Event()
            tasks = [asyncio.create_task(_drive(s, i, lim, 400.0, log, stop)) for i, s in enumerate(stores)]
            try:
                await asyncio.sleep(1.5)
                # reserved before the kill: each store's units in leases of their window (a lease whose
                # time ran out is usable again if a renewal under way adds to it), and the units it was
                # granted so far (a call the primary answered before the kill may be read after it)
                now = time.monotonic()
                held = [sum(ls.left for ls in s._leases.values() if now < ls.wend and not ls.denied) for s in stores]
                granted = [s.lease_stats.granted_units for s in stores]
                t_kill = time.monotonic()
                victim.primary.kill()
                await asyncio.to_thread(wait_role, victim.replicas[0], b"master", 60)
                wdeadline = time.monotonic() + 30
                while time.monotonic() < wdeadline and not any(
                    r[0] > t_kill and r[2] == "store" and r[3] for r in log.rows
                ):
                    await asyncio.sleep(0.05)
                await asyncio.sleep(3.0)
            finally:
                stop.set()
                await asyncio.gather(*tasks)
                for s in stores:
                    await s.close()
            return log, t_kill, held, granted, stores

        log, t_kill, held, granted, stores = asyncio.run(main())

    adm = log.admitted_per_window()
    before = [r for r in log.rows if r[0] <= t_kill]
    kill_w = before[-1][1]
    back = next((r[0] for r in log.rows if r[0] > t_kill and r[2] == "store"), None)
    gap = [r for r in log.rows if r[0] > t_kill and (back is None or r[0] < back)]
    from_leases = [r for r in gap if r[2] == "lease"]
    failures = [r for r in gap if r[2] == "failure"]
    # per store: its units in hand at the kill, and what it was granted after the kill by calls sent
    # before it, up to its last decision of the gap (a dead primary grants nothing new)
    reserved = [
        held[i] + max((r[5] for r in gap if r[4] == i), default=granted[i]) - granted[i] for i in range(len(stores))
    ]
    used = Counter(r[4] for r in from_leases)
    confirms = sum(s.lease_stats.confirms for s in stores)
    print(
        f"failover: {len(log.rows)} decisions, admitted per window {dict(sorted(adm.items()))}; held at the kill "
        f"{held}, reserved with the calls under way {reserved}, answered from leases after it "
        f"{[used[i] for i in range(len(stores))]}, failed calls {len(failures)}, "
        f"store again {(back - t_kill) if back else float('nan'):.2f} s after the kill; WAIT confirms {confirms}"
    )
    assert adm and max(adm.values()) <= limit, adm  # never over, in any window
    assert sum(held) > 0 and confirms > 0, "no lease in hand (confirmed on the replica) at the kill"
    assert back is not None, "no store decision after the promotion"
    assert all(used[i] <= reserved[i] for i in range(len(stores))), (used, reserved)  # reserved before the kill
    assert all(r[3] for r in from_leases)
    assert from_leases, "the leases in hand were not answered after the kill"
    assert all(r[0] < t_kill + lease_mod.LEASE_TTL for r in from_leases)  # honoured to their end, no further
    assert failures, "the calls after the leases did not fail (on_store_failure)"
    assert min(r[0] for r in failures) > 0 and max(r[0] for r in from_leases) < max(r[0] for r in failures)
    # the kill's window reached its limit after the promotion: the replica had the count
    assert any(r[0] > back and r[1] == kill_w and r[2] in ("store", "lease") and not r[3] for r in log.rows), (
        "the kill's window never reached its limit after the failover (nothing tested)"
    )


def test_a_replica_that_does_not_confirm_stops_leasing_on_its_primary(redis_cluster):
    """The hot key's replica stopped (SIGSTOP: connected, silent): the next lease
    call's WAIT gets no acknowledgement within CONFIRM_MS, so its lease is dropped
    (its units stay counted), the hit is answered, and the primary grants no lease
    for UNCONFIRMED_S: decisions go on the one-trip way, none fails."""
    lim = Limit(FIXED_WINDOW, 100_000, 20.0, name="unconfirmed-hot")
    prefix = f"u{uuid.uuid4().hex[:10]}"

    async def main():
        store = LeasedRedisStore(redis_cluster.url, key_prefix=prefix, timeout_ms=2000)
        await store.start()
        slot = key_slot(store.redis_keys(KEY, lim)[0].encode())
        shard = redis_cluster.shard_of(slot)
        st = store.lease_stats

        async def decide_for(n: int) -> list[bool]:
            out = []
            for _ in range(n):
                d = store.from_lease(KEY, lim, 1)
                out.append((d if d is not None else await store.hit_leasing(KEY, lim, 1)).allowed)
            return out

        try:
            for _ in range(200):  # hot, leasing, confirmed by the replica
                await decide_for(50)
                if st.confirms and st.granted:
                    break
                await asyncio.sleep(0.01)
            assert st.confirms > 0 and st.granted > 0 and st.unconfirmed == 0, st
            granted0 = st.granted
            shard.replicas[0].proc.send_signal(signal.SIGSTOP)
            try:
                answers = []
                deadline = time.monotonic() + 5
                while not st.unconfirmed and time.monotonic() < deadline:
                    answers += await decide_for(20)
                answers += await decide_for(200)  # within UNCONFIRMED_S: the one-trip path
            finally:
                shard.replicas[0].proc.send_signal(signal.SIGCONT)
            granted1 = st.granted
            return answers, granted0, granted1, dict(store._aside.unconfirmed), st
        finally:
            await store.close()

    answers, granted0, granted1, unconfirmed, st = asyncio.run(main())
    print(f"unconfirmed: {len(answers)} decisions while the replica was stopped, {st}")
    assert st.unconfirmed >= 1, st
    assert all(answers)  # every hit answered (the limit is far away), none failed
    assert unconfirmed, "the primary was not set aside"
    assert granted1 <= granted0 + 1, (granted0, granted1)  # no lease kept after the silent replica
