"""What a ban list is to its users, and the one kept in a process's memory.

Every holder answers the same calls (the sidecar's escalation, the CLI and netlimitd
use nothing else): `add`, `delete`, `flush`, `snapshot`; a follower (netlimitd) also
receives each change as a :class:`BanEvent`. Holders:

* :class:`MemoryBanList` (here): one host; netlimitd keeps it and serves it on its
  status socket (socket_client.py), so the CLI and a local sidecar reach it;
* redis_store.py: the fleet's list in Redis (the source of truth), with a pub/sub
  channel every netlimitd follows (follow.py).

Times a holder hands out are seconds *left*, never its clock: hosts need not agree
on the time of day.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from .model import Ban, IPNetwork


class AddResult(NamedTuple):
    added: bool  # False: a ban of the same prefix that lasts longer was kept (extend)
    left: float  # seconds the ban now has
    evicted: list[IPNetwork]  # dropped to stay within max_entries (the soonest to expire)


@dataclass
class Snapshot:
    bans: list[tuple[Ban, float]]  # (ban, seconds left)
    evicted: int = 0  # the holder's count of bans dropped for max_entries
    read_seconds: float = 0.0  # how long reading it took (a follower's figure)
    received: float = 0.0  # when a follower had it (monotonic; 0: unknown): time left counts from there
    # a follower's read may leave `bans` to be made later (materialize) and carry first only
    # what a kernel write needs: (version, first address, prefix length, seconds left)
    prefixes: list[tuple[int, int, int, float]] | None = None
    build: Callable[[], list[tuple[Ban, float]]] | None = None

    def materialize(self) -> None:
        """Make `bans` if the read left them for later."""
        if self.build is not None:
            self.bans, self.build = self.build(), None


@dataclass
class BanEvent:
    """One change of the list, as a follower receives it."""

    op: str  # add | del | flush
    ban: Ban | None = None  # add
    left: float = 0.0  # add: seconds left
    net: IPNetwork | None = None  # del
    evicted: list[IPNetwork] = field(default_factory=list)  # add: dropped for max_entries
    received: float = 0.0  # when a follower had it (monotonic; 0: unknown): time left counts from there


class BanList(Protocol):
    def add(
        self,
        net: IPNetwork,
        ttl: float,
        *,
        rule: str = "",
        reason: str = "",
        by: str = "",
        origin: str = "manual",
        extend: bool = False,
        repeat: tuple[float, float] | None = None,
    ) -> AddResult:
        """Ban `net` for `ttl` seconds. `extend`: keep an existing ban that lasts longer
        (an escalation never shortens one); else the new time replaces it. `repeat`
        (factor, max seconds): when `net` is not banned now but its last ban ended less
        than that ban's duration ago, this one lasts the last duration times factor
        (at most max; never less than `ttl`) -- see :func:`repeat_ttl`."""
        ...

    def delete(self, net: IPNetwork) -> bool: ...
    def flush(self) -> int: ...
    def snapshot(self) -> Snapshot: ...
    def close(self) -> None: ...


def repeat_ttl(ttl: float, repeat: tuple[float, float] | None, last: tuple[float, float] | None, now: float) -> float:
    """The duration of a new ban of a prefix that is not banned now. `last`: (its last
    ban's duration, the time until which that ban is remembered = its end + its
    duration). A recidive (now before that time) gets last duration x factor, capped at
    max; anyone else `ttl`. The Redis store's ADD_LUA does the same in the script."""
    if repeat is None or last is None or now >= last[1]:
        return ttl
    factor, most = repeat
    return min(max(ttl, last[0] * factor), max(most, ttl))


class MemoryBanList:
    """A bounded ban list in this process (thread-safe). `on_event` is called, outside
    the lock, with every change."""

    def __init__(
        self,
        max_entries: int,
        *,
        clock: Callable[[], float] = time.time,
        on_event: Callable[[BanEvent], None] | None = None,
    ):
        self.max_entries = max_entries
        self.clock = clock
        self.on_event = on_event
        self._bans: dict[IPNetwork, Ban] = {}
        self._heap: list[tuple[float, int, int, IPNetwork]] = []  # (expires, version, int, net), lazy
        # the last ban of each prefix, remembered for its duration after its end (repeat)
        self._last: dict[IPNetwork, tuple[float, float]] = {}  # net -> (duration, remembered until)
        self._last_heap: list[tuple[float, int, int, IPNetwork]] = []  # (remembered until, ...), lazy
        self._lock = threading.Lock()
        self.added = 0
        self.evicted = 0

    def __len__(self) -> int:
        with self._lock:
            self._prune(self.clock())
            return len(self._bans)

    def _prune(self, now: float) -> None:
        h = self._heap
        while h and h[0][0] <= now:
            exp, _v, _i, net = heapq.heappop(h)
            b = self._bans.get(net)
            if b is not None and b.expires == exp:
                del self._bans[net]
        lh = self._last
        hh = self._last_heap
        while hh and (hh[0][0] <= now or len(lh) > self.max_entries):
            until, _v, _i, net = heapq.heappop(hh)
            last = lh.get(net)
            if last is not None and last[1] == until:
                del lh[net]

    def _soonest(self) -> IPNetwork | None:
        h = self._heap
        while h:
            exp, _v, _i, net = h[0]
            b = self._bans.get(net)
            if b is not None and b.expires == exp:
                return net
            heapq.heappop(h)
        return None

    def add(
        self,
        net: IPNetwork,
        ttl: float,
        *,
        rule: str = "",
        reason: str = "",
        by: str = "",
        origin: str = "manual",
        extend: bool = False,
        repeat: tuple[float, float] | None = None,
    ) -> AddResult:
        with self._lock:
            now = self.clock()
            self._prune(now)
            old = self._bans.get(net)
            if old is None:
                ttl = repeat_ttl(ttl, repeat, self._last.get(net), now)
            expires = now + ttl
            if extend and old is not None and old.expires >= expires:
                return AddResult(False, old.expires - now, [])
            ban = Ban.make(net, expires, rule=rule, reason=reason, by=by, added=now, origin=origin)
            self._bans[net] = ban
            heapq.heappush(self._heap, (expires, net.version, int(net.network_address), net))
            self._last[net] = (ttl, expires + ttl)
            heapq.heappush(self._last_heap, (expires + ttl, net.version, int(net.network_address), net))
            self._prune(now)  # the remembered last bans stay within max_entries too
            evicted: list[IPNetwork] = []
            while len(self._bans) > self.max_entries:
                first = self._soonest()
                if first is None:  # pragma: no cover - the heap holds every ban
                    break
                del self._bans[first]
                evicted.append(first)
            self.added += 1
            self.evicted += len(evicted)
        self._emit(BanEvent("add", ban, ttl, evicted=evicted))
        return AddResult(True, ttl, evicted)

    def delete(self, net: IPNetwork) -> bool:
        with self._lock:
            self._prune(self.clock())
            gone = self._bans.pop(net, None) is not None
            self._last.pop(net, None)  # lifted by hand: forgiven, the next ban starts again at `ban`
        if gone:
            self._emit(BanEvent("del", net=net))
        return gone

    def flush(self) -> int:
        with self._lock:
            self._prune(self.clock())
            n = len(self._bans)
            self._bans.clear()
            self._heap.clear()
            self._last.clear()
            self._last_heap.clear()
        self._emit(BanEvent("flush"))
        return n

    def snapshot(self) -> Snapshot:
        with self._lock:
            now = self.clock()
            self._prune(now)
            return Snapshot([(b, b.expires - now) for b in self._bans.values()], self.evicted)

    def close(self) -> None:
        pass

    def _emit(self, ev: BanEvent) -> None:
        if self.on_event is not None:
            ev.received = time.monotonic()
            self.on_event(ev)
