"""RedisStore behind a REAL Redis Sentinel set-up (tests/helpers/redis_sentinel.py:
1 primary, 1 replica, 3 sentinels, down-after-milliseconds 1000): the primary
resolved and checked, the database of the URL, a forced failover (SENTINEL
FAILOVER: the old primary answers -READONLY) and a crash (SIGKILL) followed to
the promoted replica with the failover counted, sentinels that do not know the
service, a dead sentinel skipped."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import pytest
from redis_nodes import await_for, wait_for
from redis_sentinel import SentinelSetup

from netlimit.limit.algorithms import Limit
from netlimit.limit.stores import RedisStore, StoreError

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]


def arun(coro):
    return asyncio.run(coro)


def prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def sentinels(tmp_path):
    with SentinelSetup(tmp_path) as s:
        yield s


def test_resolves_the_primary_and_follows_a_forced_failover(sentinels, caplog):
    limit = Limit("fixed_window", 100, 3600)
    pre = prefix()

    async def main():
        store = RedisStore(sentinels.url + "/3", timeout_ms=500, key_prefix=pre)
        try:
            with caplog.at_level(logging.INFO, logger="netlimit.limit"):
                await store.start()
            assert store.kind == "sentinel"
            t = store.topology()
            assert t["primary"] == sentinels.primary.address and t["service"] == "mymaster"
            assert [n["address"] for n in t["nodes"] if n["role"] == "replica"] == [sentinels.replica.address]
            assert all(s["reachable"] for s in t["sentinels"][:1])
            for i in range(10):
                assert (await store.hit("k", limit)).remaining == 99 - i
            c = sentinels.primary.client(db=3)
            assert c.dbsize() == 1  # the URL's database
            c.close()
            await await_for(lambda: store.topology()["subscribed_to"], 5, "the +switch-master subscription")

            old = sentinels.primary
            # the replica has every write so far (asynchronous replication: wait for its offset)
            wait_for(lambda: _offsets(sentinels), 5, "the replica to catch up")
            assert sentinels.sentinels[0].call("SENTINEL", "FAILOVER", "mymaster")
            took, errors, ok = await _until_store_on(store, sentinels.replica.address, "k", limit, 20)
            assert store.topology()["primary"] == sentinels.replica.address
            assert store.stats.failovers == 1
            assert "the primary is now " + sentinels.replica.address in caplog.text
            # the ten hits before went with the data; hits on the old primary in the
            # moment of the switch may be lost (asynchronous replication)
            d = await store.hit("k", limit)
            assert 100 - 10 - ok - 1 <= d.remaining <= 100 - 10 - 1, (d, ok)
            wait_for(lambda: old.call("ROLE")[0] == b"slave", 20, "the old primary to become a replica")
            print(f"forced failover followed in {took:.2f} s, {errors} store errors meanwhile")
        finally:
            await store.close()

    arun(main())


def _offsets(s: SentinelSetup) -> bool:
    p = s.primary.client().info("replication")["master_repl_offset"]
    return s.replica.client().info("replication").get("slave_repl_offset") == p


async def _until_store_on(store, address, key, limit, timeout):
    """Hit until a decision comes from ``address``; (seconds, store errors
    meanwhile, decisions meanwhile)."""
    t0 = time.monotonic()
    errors = ok = 0
    while True:
        try:
            await store.hit(key, limit)
            ok += 1
            if store.topology()["primary"] == address:
                return time.monotonic() - t0, errors, ok - 1
        except StoreError:
            errors += 1
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"no decision from {address} within {timeout} s: {store.topology()}")
        await asyncio.sleep(0.05)


def test_a_killed_primary_is_replaced_by_the_promoted_replica(sentinels):
    limit = Limit("token_bucket", 1000, 3600)
    pre = prefix()

    async def main():
        store = RedisStore(sentinels.url, timeout_ms=100, key_prefix=pre)
        try:
            await store.start()
            await await_for(lambda: store.topology()["subscribed_to"], 5, "the +switch-master subscription")
            for _ in range(20):
                await store.hit("x", limit)
            t_kill = time.monotonic()
            sentinels.primary.kill()
            with pytest.raises(StoreError):
                await store.hit("x", limit)
            took, errors, _ = await _until_store_on(store, sentinels.replica.address, "x", limit, 30)
            resumed = time.monotonic() - t_kill
            assert errors >= 1 and store.stats.failovers == 1
            assert store.stats.node_errors.get(sentinels.primary.address, 0) >= 1
            # 1 s to notice, then the sentinels' vote and the promotion
            assert resumed < 10, resumed
            print(f"decisions resumed {resumed:.2f} s after the kill")
        finally:
            await store.close()

    arun(main())


def test_unknown_service_and_a_dead_sentinel(sentinels):
    limit = Limit("fixed_window", 5, 60)

    async def main():
        store = RedisStore(sentinels.url.replace("/mymaster", "/nosuch"), timeout_ms=200, key_prefix=prefix())
        try:
            await store.start(budget=1.0)
            with pytest.raises(StoreError, match="does not monitor 'nosuch'"):
                await store.hit("a", limit)
        finally:
            await store.close()
        sentinels.sentinels[0].kill()
        store = RedisStore(sentinels.url, timeout_ms=200, key_prefix=prefix())
        try:
            await store.start(budget=2.0)
            assert (await store.hit("a", limit)).allowed
            t = store.topology()
            assert t["sentinels"][0]["reachable"] is False and t["primary"] == sentinels.primary.address
        finally:
            await store.close()

    arun(main())


def test_a_demoted_primary_answers_readonly_and_the_sentinels_are_asked_again(sentinels):
    """The primary turned into a replica behind the sentinels' back (as a failover
    does to the old one): the script's write is refused with -READONLY, which is a
    store error (the policy decides) and makes the client ask the sentinels again;
    a named server that is not a primary is not used (ROLE check)."""
    limit = Limit("fixed_window", 5, 60)

    async def main():
        store = RedisStore(sentinels.url, timeout_ms=500, key_prefix=prefix())
        try:
            await store.start()
            assert (await store.hit("a", limit)).allowed
            asked = store.stats.refreshes
            sentinels.primary.call("REPLICAOF", "127.0.0.1", sentinels.replica.port)
            with pytest.raises(StoreError, match="READONLY"):
                await store.hit("a", limit)
            assert store.stats.node_errors[sentinels.primary.address] == 1
            await await_for(lambda: store.stats.refreshes > asked, 5, "the sentinels asked again")
            # they still name the demoted server for now: ROLE says slave, so it is not taken
            await await_for(lambda: "not a primary" in (store.topology()["last_error"] or ""), 5, "the ROLE check")
        finally:
            await store.close()

    arun(main())
