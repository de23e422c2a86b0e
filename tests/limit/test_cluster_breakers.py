"""One breaker per primary on a REAL Redis Cluster (3 primaries + 3 replicas of the
test's own): a primary killed under load fails over; the keys of the two other
shards stay on the shared store, exact, while the dead shard's keys follow
on_store_failure until its replica is promoted, then resume (issue 35 item 2)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from redis_cluster import RedisCluster, wait_role

from netlimit.config.validate import load_string
from netlimit.limit.limiter import OK, SRC_CLOSED, SRC_STORE, Limiter
from netlimit.limit.request import CheckRequest
from netlimit.limit.rules import from_loaded
from netlimit.limit.stores import RedisStore
from netlimit.limit.stores.cluster import key_slot

pytestmark = [pytest.mark.redis, pytest.mark.timeout(180)]

LIMIT = 40  # per key per hour, sliding_window_log: admissions in the test's minute are exact
CONFIG = f"""
version: 1
http:
  domain: shards
  descriptors:
    - key: user
      rate_limit: {{unit: hour, requests_per_unit: {LIMIT}, name: per-user}}
      algorithm: sliding_window_log
"""
KEYS_PER_SHARD = 4
RATE = 200  # requests per second over all keys (each key passes its limit in a few seconds)


def _req(user: str) -> CheckRequest:
    return CheckRequest.simple("shards", [[("user", user)]])


def test_a_primary_killed_under_load_only_its_keys_follow_on_store_failure(tmp_path):
    # cluster-require-full-coverage no: with yes, Redis itself answers CLUSTERDOWN for
    # every key from the dead primary's FAIL until the promotion (no client can help it)
    with RedisCluster(tmp_path, node_timeout_ms=1000, full_coverage=False) as cluster:
        rules = from_loaded(load_string(CONFIG, "shards.yaml"))
        rule = rules.rules[0]
        prefix = f"b{uuid.uuid4().hex[:8]}"

        async def main():
            store = RedisStore(cluster.url, timeout_ms=200, key_prefix=prefix)
            await store.start()
            lim = Limiter(rules, store, on_store_failure="closed", retry_interval=0.25)
            shards = cluster.shards()
            victim = shards[0]
            by_shard: dict[int, list[str]] = {i: [] for i in range(len(shards))}
            n = 0
            while min(len(v) for v in by_shard.values()) < KEYS_PER_SHARD:
                user = f"u{n}"
                n += 1
                skey = rules.store_key(rule, [("user", user)])
                slot = key_slot(store.redis_keys(skey, rule.limit)[0].encode())
                i = next(i for i, s in enumerate(shards) if s.owns(slot))
                if len(by_shard[i]) < KEYS_PER_SHARD:
                    by_shard[i].append(user)
            dead_keys = by_shard[0]
            live_keys = [u for i, us in by_shard.items() if i != 0 for u in us]
            users = dead_keys + live_keys
            # (when, user, code, source) of every decision
            log: list[tuple[float, str, int, str]] = []
            stop = asyncio.Event()
            down_seen: set[str] = set()

            async def load() -> None:
                i = 0
                t_next = time.monotonic()
                while not stop.is_set():
                    user = users[i % len(users)]
                    i += 1
                    r = await lim.check(_req(user))
                    log.append((time.monotonic(), user, r.code, r.statuses[0].source))
                    down_seen.update(lim.stores_down())
                    t_next += 1 / RATE
                    delay = t_next - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    elif i % 20 == 0:
                        await asyncio.sleep(0)  # let the store's background tasks run

            async def load_for(seconds: float) -> None:
                await asyncio.sleep(seconds)

            tasks = [asyncio.create_task(load()) for _ in range(4)]
            try:
                await load_for(1.0)
                t_kill = time.monotonic()
                victim.primary.kill()
                replica = victim.replicas[0]
                t_promoted = await asyncio.to_thread(wait_role, replica, b"master", 30)
                # until a decision for a dead-shard key comes from the store again
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline and not any(
                    t > t_promoted and u in dead_keys and src == SRC_STORE for t, u, _c, src in log
                ):
                    await asyncio.sleep(0.02)
                await load_for(1.0)
            finally:
                stop.set()
                await asyncio.gather(*tasks)
                await store.close()
            return log, t_kill, t_promoted, dead_keys, live_keys, down_seen, str(victim.primary.address)

        log, t_kill, t_promoted, dead_keys, live_keys, down_seen, victim_addr = asyncio.run(main())

    live = [e for e in log if e[1] in live_keys]
    dead = [e for e in log if e[1] in dead_keys]
    # the two healthy shards: every decision from the shared store, and exact
    assert [e for e in live if e[3] != SRC_STORE] == [], "a healthy shard's key fell back"
    for u in live_keys:
        mine = [e for e in live if e[1] == u]
        admitted = sum(1 for e in mine if e[2] == OK)
        assert admitted == min(len(mine), LIMIT), (u, admitted, len(mine))
    # the dead shard's keys: closed (denied) after the kill, the store again after the promotion
    after_kill = [e for e in dead if e[0] > t_kill]
    closed = [e for e in after_kill if e[3] == SRC_CLOSED]
    assert closed, "the dead shard's keys never followed on_store_failure"
    assert all(e[2] != OK for e in closed)
    back = [e for e in after_kill if e[3] == SRC_STORE and e[0] > t_promoted]
    assert back, "the dead shard's keys did not come back to the store"
    share = back[0][0] - t_promoted
    last_closed = max(e[0] for e in closed)
    print(
        f"{len(log)} decisions; killed at 0, replica promoted at {t_promoted - t_kill:.2f} s, "
        f"first store decision for the dead shard {share:.3f} s after that, last fallback at "
        f"{last_closed - t_kill:.2f} s; healthy shards: {len(live)} decisions, 0 fallbacks"
    )
    assert down_seen == {victim_addr}, down_seen  # only the dead primary's breaker opened
    assert share <= 1.0  # netlimit's share of the failover (0.5 s measured on a quiet host)
