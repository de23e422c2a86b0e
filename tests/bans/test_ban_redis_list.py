"""The fleet's ban list in a real Redis: atomic Lua writes, the bound, the channel."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import time

import pytest
import redis

from netlimit.bans.redis_store import AsyncRedisBanList, RedisBanList, keys, parse_event

pytestmark = pytest.mark.redis
N = ipaddress.ip_network


def channel_messages(r: redis.Redis, channel: str, action, n: int, timeout: float = 5.0) -> list:
    ps = r.pubsub()
    ps.subscribe(channel)
    first = ps.get_message(timeout=timeout)  # Redis confirms: from now on every change reaches us
    assert first is not None and first["type"] == "subscribe"
    action()
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        m = ps.get_message(timeout=0.2)
        if m is not None and m["type"] == "message":
            out.append(parse_event(m["data"]))
    ps.close()
    return out


def test_add_extend_delete_flush_snapshot(redis_server, prefix):
    lst = RedisBanList(redis_server.url, key_prefix=prefix, max_entries=100)
    try:
        r = lst.add(N("203.0.113.0/24"), 900, rule="login", reason="r", by="me", origin="http")
        assert r.added and r.left == 900 and r.evicted == []
        r = lst.add(N("203.0.113.0/24"), 60, extend=True)  # an escalation never shortens a ban
        assert not r.added and 890 < r.left <= 900
        lst.add(N("2001:db8::/64"), 30)
        snap = lst.snapshot()
        got = {str(b.net): (round(left), b.rule, b.by, b.origin) for b, left in snap.bans}
        assert got == {"203.0.113.0/24": (900, "login", "me", "http"), "2001:db8::/64": (30, "", "", "manual")}
        ban = next(b for b, _ in snap.bans if b.rule == "login")
        assert abs(ban.expires - ban.added - 900) < 0.01  # `added` comes from Redis's clock too
        assert lst.add(N("203.0.113.0/24"), 60).added  # a manual add sets the time
        assert lst.delete(N("2001:db8::/64")) and not lst.delete(N("2001:db8::/64"))
        assert lst.flush() == 1 and lst.snapshot().bans == []
    finally:
        lst.r.delete(*keys(prefix)[:3])
        lst.close()


def test_bounded_the_soonest_to_expire_go_and_are_counted(redis_server, prefix):
    lst = RedisBanList(redis_server.url, key_prefix=prefix, max_entries=3)
    try:
        for i, ttl in enumerate((30, 10, 20)):
            lst.add(N(f"192.0.2.{i}/32"), ttl)
        assert lst.add(N("192.0.2.9/32"), 40).evicted == [N("192.0.2.1/32")]
        snap = lst.snapshot()
        assert {str(b.net) for b, _ in snap.bans} == {"192.0.2.0/32", "192.0.2.2/32", "192.0.2.9/32"}
        assert snap.evicted == 1
        assert lst.r.hlen(keys(prefix)[1]) == 3  # the details go with their member
    finally:
        lst.r.delete(*keys(prefix)[:3])
        lst.close()


def test_expired_members_are_pruned_by_the_next_write(redis_server, prefix):
    lst = RedisBanList(redis_server.url, key_prefix=prefix, max_entries=10)
    try:
        lst.add(N("198.51.100.1/32"), 0.05)
        time.sleep(0.1)
        assert lst.snapshot().bans == []  # time is up: not listed
        lst.add(N("198.51.100.2/32"), 60)
        assert lst.r.zcard(keys(prefix)[0]) == 1 and lst.r.hlen(keys(prefix)[1]) == 1
    finally:
        lst.r.delete(*keys(prefix)[:3])
        lst.close()


def test_every_change_is_published_with_the_time_left(redis_server, prefix):
    lst = RedisBanList(redis_server.url, key_prefix=prefix, max_entries=1)
    r = redis.Redis.from_url(redis_server.url)
    try:

        def changes():
            lst.add(N("198.51.100.1/32"), 60, rule="x")
            lst.add(N("198.51.100.2/32"), 120)  # evicts .1
            lst.delete(N("198.51.100.2/32"))
            lst.flush()

        evs = channel_messages(r, keys(prefix)[3], changes, 4)
        assert [e.op for e in evs] == ["add", "add", "del", "flush"]
        assert evs[0].ban.net == N("198.51.100.1/32") and evs[0].left == 60 and evs[0].ban.rule == "x"
        assert evs[1].evicted == [N("198.51.100.1/32")]
        assert evs[2].net == N("198.51.100.2/32")
    finally:
        lst.r.delete(*keys(prefix)[:3])
        lst.close()
        r.close()


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"null",
        b"[]",
        b'{"op": "add"}',
        b'{"op": "add", "net": "10.0.0.1/24", "exp": 1, "now": 0}',
        b'{"op": "del", "net": "x"}',
        b'{"op": "nuke"}',
        json.dumps({"op": "add", "net": "10.0.0.1/32", "exp": 5, "now": 1, "evicted": ["a" * 10] * 2}).encode()[:-3],
        b"x" * (2 << 20),
    ],
)
def test_a_message_that_is_not_ours_is_ignored(data):
    assert parse_event(data) is None


def test_an_event_drops_what_is_not_a_prefix_among_the_evicted():
    ev = parse_event(b'{"op":"add","net":"10.0.0.1/32","exp":5000,"now":1000,"d":"{}","evicted":["x","10.0.0.2/32"]}')
    assert ev.left == 4 and ev.evicted == [N("10.0.0.2/32")]
    ev = parse_event(b'{"op":"add","net":"10.0.0.1/32","exp":5000,"now":1000,"d":"{}","evicted":{}}')  # cjson's []
    assert ev.evicted == []


def test_the_sidecars_async_face(redis_server, prefix):
    async def run():
        lst = AsyncRedisBanList(redis_server.url, key_prefix=prefix, max_entries=10)
        try:
            r = await lst.add(N("203.0.113.9/32"), 300, rule="r", by="sidecar@x", origin="http", extend=True)
            assert r.added and r.left == 300
            r = await lst.add(N("203.0.113.9/32"), 100, extend=True)
            assert not r.added
        finally:
            await lst.close()

    asyncio.run(run())
    lst = RedisBanList(redis_server.url, key_prefix=prefix)
    try:
        (b, left), *_ = lst.snapshot().bans
        assert (str(b.net), b.by, b.origin, round(left, -1)) == ("203.0.113.9/32", "sidecar@x", "http", 300)
    finally:
        lst.r.delete(*keys(prefix)[:3])
        lst.close()
