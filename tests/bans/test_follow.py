"""Following the list from a thread: the whole list on every (re)connect, then each
change; a Redis that goes away and comes back loses nothing."""

from __future__ import annotations

import ipaddress
import threading
import time

import pytest

from netlimit.bans.follow import Inbox, RedisFollower
from netlimit.bans.redis_store import RedisBanList, keys
from netlimit.bans.store import BanEvent

pytestmark = pytest.mark.redis
N = ipaddress.ip_network


class Sink:
    def __init__(self) -> None:
        self.woken = threading.Event()
        self.inbox = Inbox(self.woken.set)
        self.items: list = []

    def wait_for(self, pred, timeout: float = 10.0, what: str = ""):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.woken.wait(0.1)
            self.woken.clear()
            self.items += self.inbox.drain()
            if pred(self.items):
                return self.items
        raise AssertionError(f"timed out waiting for {what}: {self.items!r}")


def kinds(items):
    return [k for k, _ in items]


def test_snapshot_then_changes_then_a_restart_of_redis(redis_factory, prefix):
    server = redis_factory()
    lst = RedisBanList(server.url, key_prefix=prefix)
    lst.add(N("203.0.113.0/24"), 600)
    sink = Sink()
    f = RedisFollower(server.url, key_prefix=prefix, max_entries=100, inbox=sink.inbox, timeout=1.0, max_backoff=0.5)
    f.start()
    try:
        items = sink.wait_for(lambda it: "snapshot" in kinds(it), what="the first snapshot")
        snap = items[0][1]
        assert snap.bans == [] and snap.prefixes == [(4, 0xCB007100, 24, pytest.approx(600, abs=5))]
        snap.materialize()  # the main loop's: the bans, their details parsed, only when needed
        assert [str(b.net) for b, _ in snap.bans] == ["203.0.113.0/24"] and f.connected
        lst.add(N("198.51.100.7/32"), 60, rule="r")
        items = sink.wait_for(lambda it: "event" in kinds(it), what="the add")
        ev: BanEvent = items[-1][1]
        assert ev.op == "add" and ev.ban.net == N("198.51.100.7/32")
        # Redis goes away: the follower says so, and on its return reloads the whole list
        server.stop()
        sink.wait_for(lambda it: "down" in kinds(it), what="the loss of Redis")
        assert not f.connected
        server.start()
        lst2 = RedisBanList(server.url, key_prefix=prefix)  # a fresh server: an empty list
        lst2.add(N("2001:db8::/64"), 60)
        n0 = len(sink.items)
        items = sink.wait_for(lambda it: "snapshot" in kinds(it[n0:]), timeout=15, what="the reload")
        snap = next(x for k, x in items[n0:] if k == "snapshot")
        snap.materialize()
        assert "2001:db8::/64" in {str(b.net) for b, _ in snap.bans}
        lst2.close()
    finally:
        f.stop()
        lst.close()


def test_the_kernels_bans_go_out_through_the_thread(redis_server, prefix):
    sink = Sink()
    f = RedisFollower(redis_server.url, key_prefix=prefix, max_entries=100, inbox=sink.inbox)
    f.start()
    lst = RedisBanList(redis_server.url, key_prefix=prefix)
    try:
        sink.wait_for(lambda it: "snapshot" in kinds(it), what="the first snapshot")
        assert f.publish(N("192.0.2.0/24"), 120, rule="udp-flood", by="netlimitd@h (kernel)", origin="network")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not lst.snapshot().bans:
            time.sleep(0.05)
        (b, left), *_ = lst.snapshot().bans
        assert (str(b.net), b.rule, b.origin) == ("192.0.2.0/24", "udp-flood", "network") and left > 110
        assert f.published == 1
    finally:
        f.stop()
        lst.r.delete(*keys(prefix)[:3])
        lst.close()


def test_an_inbox_that_overflows_forces_a_reload():
    woke = []
    inbox = Inbox(lambda: woke.append(1), limit=3)
    for i in range(5):
        inbox.put("event", i)
    assert inbox.overflowed and len(inbox.drain()) == 1 and len(woke) == 5
