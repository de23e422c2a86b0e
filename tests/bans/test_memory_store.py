"""The memory ban list (one host; netlimitd keeps it): bounded, with events."""

from __future__ import annotations

import ipaddress

from netlimit.bans.store import MemoryBanList

N = ipaddress.ip_network


class Clock:
    def __init__(self) -> None:
        self.t = 5000.0

    def __call__(self) -> float:
        return self.t


def test_add_extend_delete_flush_and_events():
    clock = Clock()
    events = []
    lst = MemoryBanList(10, clock=clock, on_event=events.append)
    r = lst.add(N("203.0.113.0/24"), 60, rule="login", reason="r", by="me", origin="http")
    assert r.added and r.left == 60 and r.evicted == []
    # extend: a shorter escalation keeps the longer ban; a manual add replaces it
    assert not lst.add(N("203.0.113.0/24"), 30, extend=True).added
    assert lst.add(N("203.0.113.0/24"), 30).added
    snap = lst.snapshot()
    assert [(str(b.net), left, b.rule, b.origin) for b, left in snap.bans] == [("203.0.113.0/24", 30, "", "manual")]
    clock.t += 10
    assert lst.snapshot().bans[0][1] == 20
    assert lst.delete(N("203.0.113.0/24")) and not lst.delete(N("203.0.113.0/24"))
    lst.add(N("2001:db8::/64"), 5)
    assert lst.flush() == 1 and len(lst) == 0
    assert [e.op for e in events] == ["add", "add", "del", "add", "flush"]
    assert events[0].ban.rule == "login" and events[0].left == 60


def test_expired_bans_are_gone():
    clock = Clock()
    lst = MemoryBanList(10, clock=clock)
    lst.add(N("198.51.100.1/32"), 5)
    lst.add(N("198.51.100.2/32"), 50)
    clock.t += 6
    assert [str(b.net) for b, _ in lst.snapshot().bans] == ["198.51.100.2/32"]
    assert len(lst) == 1


def test_bounded_the_soonest_to_expire_is_dropped_and_counted():
    clock = Clock()
    events = []
    lst = MemoryBanList(3, clock=clock, on_event=events.append)
    for i, ttl in enumerate((30, 10, 20)):
        lst.add(N(f"192.0.2.{i}/32"), ttl)
    r = lst.add(N("192.0.2.9/32"), 40)
    assert r.evicted == [N("192.0.2.1/32")] and events[-1].evicted == [N("192.0.2.1/32")]
    assert lst.evicted == 1 and len(lst) == 3
    # a new ban that itself expires first is the one dropped
    r = lst.add(N("192.0.2.8/32"), 1)
    assert r.evicted == [N("192.0.2.8/32")] and len(lst) == 3
    assert lst.snapshot().evicted == 2
