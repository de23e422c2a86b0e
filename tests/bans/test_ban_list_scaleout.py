"""The fleet's ban list on the storage URLs the sidecar takes beyond one server: a
real Redis Cluster (3 primaries + 3 replicas) and a real Sentinel set-up (1 primary,
1 replica, 3 sentinels). The scripts' keys share one slot, a follower connected to
the cluster hears every change, and behind Sentinel the list survives a failover:
the follower reconnects to the promoted primary and loads the whole list again."""

from __future__ import annotations

import asyncio
import ipaddress
import time

import pytest
from redis_sentinel import SentinelSetup
from test_follow import Sink, kinds

from netlimit.bans.follow import RedisFollower
from netlimit.bans.redis_store import AsyncRedisBanList, RedisBanList, keys

pytestmark = pytest.mark.redis
N = ipaddress.ip_network


@pytest.fixture(params=["cluster", "sentinel"])
def url(request, tmp_path):
    if request.param == "cluster":
        yield request.getfixturevalue("redis_cluster").url
    else:
        with SentinelSetup(tmp_path) as s:
            yield s.url


def test_add_snapshot_follow_and_escalate_through_the_url(url, prefix):
    lst = RedisBanList(url, key_prefix=prefix, max_entries=3)
    sink = Sink()
    f = RedisFollower(url, key_prefix=prefix, max_entries=3, inbox=sink.inbox, timeout=2.0, max_backoff=0.5)
    f.start()
    try:
        sink.wait_for(lambda it: "snapshot" in kinds(it), what="the first snapshot")
        assert lst.add(N("203.0.113.0/24"), 600, rule="login", reason="r").added
        lst.add(N("2001:db8::/64"), 30)
        sink.wait_for(lambda it: kinds(it).count("event") >= 2, what="both adds on the channel")
        for i in range(3):  # the bound holds in a cluster too: the soonest to expire go
            lst.add(N(f"192.0.2.{i}/32"), 60 + i)
        snap = lst.snapshot()
        # 2001:db8::/64 (30 s) went first, then 192.0.2.0/32 (60 s)
        assert sorted(str(b.net) for b, _ in snap.bans) == ["192.0.2.1/32", "192.0.2.2/32", "203.0.113.0/24"]
        assert snap.evicted == 2
        assert lst.delete(N("192.0.2.1/32")) and lst.flush() == 2

        async def escalate() -> bool:  # what a sidecar's escalation writes, on the same URL
            a = AsyncRedisBanList(url, key_prefix=prefix)
            try:
                return (await a.add(N("198.51.100.7/32"), 60, rule="api", origin="http")).added
            finally:
                await a.close()

        assert asyncio.run(escalate())
        assert [str(b.net) for b, _ in lst.snapshot().bans] == ["198.51.100.7/32"]
    finally:
        f.stop()
        lst.r.delete(*keys(prefix)[:3])
        lst.close()


def test_the_list_survives_a_sentinel_failover(tmp_path, prefix):
    with SentinelSetup(tmp_path) as s:
        lst = RedisBanList(s.url, key_prefix=prefix)
        sink = Sink()
        f = RedisFollower(s.url, key_prefix=prefix, max_entries=100, inbox=sink.inbox, timeout=1.0, max_backoff=0.3)
        f.start()
        try:
            sink.wait_for(lambda it: "snapshot" in kinds(it), what="the first snapshot")
            lst.add(N("203.0.113.0/24"), 600)
            deadline = time.monotonic() + 10  # replicated before the kill (WAIT: one replica)
            while lst.r.wait(1, 1000) < 1:
                assert time.monotonic() < deadline, "the replica never acknowledged the ban"
            s.primary.kill()  # SIGKILL
            sink.items.clear()
            items = sink.wait_for(
                lambda it: any(k == "snapshot" and v.prefixes for k, v in it), 30, "the whole list from the new primary"
            )
            snap = next(v for k, v in items if k == "snapshot" and v.prefixes)
            snap.materialize()  # a follower's list: its bans made when the main loop needs them
            assert [str(b.net) for b, _ in snap.bans] == ["203.0.113.0/24"]
            assert lst.add(N("198.51.100.0/24"), 60).added  # writes go to the promoted primary
        finally:
            f.stop()
            lst.close()
