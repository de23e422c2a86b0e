"""Follow a ban list from a thread: what netlimitd's main loop drains.

:class:`RedisFollower` keeps one subscription to the list's channel. On every
(re)connect it first subscribes, waits for Redis to confirm, then reads the whole
list (a snapshot): a change made after the read is also in the channel, so none is
lost between the two, and one seen twice is harmless (bans are idempotent). It hands
the main loop ("snapshot", Snapshot), ("event", BanEvent), ("down", why) items through
a bounded inbox and wakes it (`wake`). An inbox that overflows (the main loop stalled)
is emptied and the follower reconnects, which reloads the whole list: nothing is lost,
memory stays bounded.

Writes that belong to the main loop's host (the bans its kernel added by itself) go
out through the same thread (`publish`), so the main loop never waits on Redis.

:class:`Inbox` is also what a memory list feeds (netlimitd with `store: memory`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ..logevery import LogEvery
from .model import IPNetwork
from .redis_store import RedisBanList, keys, parse_event
from .store import BanEvent, Snapshot

log = logging.getLogger("netlimit.bans")

#: items the main loop may leave in the inbox before it is considered stalled
MAX_INBOX = 100_000
#: bans the main loop may hand to the thread to publish before more are dropped (counted)
MAX_OUTBOX = 10_000
POLL_S = 0.2  # the longest the thread waits for a message before looking at its outbox


class Inbox:
    """A bounded, thread-safe queue of follower items that wakes the main loop."""

    def __init__(self, wake: Callable[[], None], limit: int = MAX_INBOX):
        self.wake = wake
        self.limit = limit
        self._q: deque[tuple[str, Any]] = deque()
        self._lock = threading.Lock()
        self.overflowed = False

    def put(self, kind: str, item: Any = None) -> None:
        with self._lock:
            if len(self._q) >= self.limit:
                self._q.clear()
                self.overflowed = True
            else:
                self._q.append((kind, item))
        self.wake()

    def event(self, ev: BanEvent) -> None:
        self.put("event", ev)

    def drain(self) -> list[tuple[str, Any]]:
        with self._lock:
            items = list(self._q)
            self._q.clear()
            return items


class RedisFollower:
    def __init__(
        self,
        url: str,
        *,
        key_prefix: str,
        max_entries: int,
        inbox: Inbox,
        timeout: float = 2.0,
        health_every: float = 5.0,
        max_backoff: float = 5.0,
    ):
        self.url = url
        self.key_prefix = key_prefix
        self.max_entries = max_entries
        self.inbox = inbox
        self.timeout = timeout
        self.health_every = health_every
        self.max_backoff = max_backoff
        self.channel = keys(key_prefix)[3]
        self.connected = False
        self.last_error = ""
        self.connects = 0
        self.published = 0
        self.publish_failed = 0
        self.publish_dropped = 0
        self._outbox: deque[dict[str, Any]] = deque()
        self._olock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._log = LogEvery(10.0)

    # --- main loop side ------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ban-follower", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def publish(self, net: IPNetwork, ttl: float, **details: Any) -> bool:
        """Queue one ban for the list (False: the outbox is full, the ban is dropped)."""
        with self._olock:
            if len(self._outbox) >= MAX_OUTBOX:
                self.publish_dropped += 1
                return False
            self._outbox.append({"net": net, "ttl": ttl, **details})
            return True

    # --- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        import redis

        backoff = 0.1
        while not self._stop.is_set():
            lst: RedisBanList | None = None
            ps: Any = None
            try:
                lst = RedisBanList(
                    self.url, key_prefix=self.key_prefix, max_entries=self.max_entries, timeout=self.timeout
                )
                ps = lst.r.pubsub()
                ps.subscribe(self.channel)
                deadline = time.monotonic() + self.timeout
                while True:  # the confirmation: from now on every change reaches us
                    m = ps.get_message(timeout=max(0.01, deadline - time.monotonic()))
                    if m is not None and m.get("type") == "subscribe":
                        break
                    if time.monotonic() > deadline:
                        raise redis.exceptions.TimeoutError("no confirmation of SUBSCRIBE")
                t0 = time.monotonic()
                snap: Snapshot = lst.snapshot(lazy=True)  # the bans made by the main loop when it needs them
                snap.received = time.monotonic()
                snap.read_seconds = snap.received - t0
                self.inbox.overflowed = False
                self.inbox.put("snapshot", snap)
                if not self.connected:
                    log.info("ban list: following %s (%d bans)", self.url, len(snap.bans or snap.prefixes or []))
                self.connected = True
                self.connects += 1
                self.last_error = ""
                backoff = 0.1
                self._follow(lst, ps)
            except (redis.exceptions.RedisError, OSError, ValueError) as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                if self.connected:
                    log.warning("ban list: lost %s (%s); the bans in the kernel stay and expire on time", self.url, exc)
                elif self._log.due("down") >= 0:
                    log.warning("ban list: cannot reach %s (%s); retrying", self.url, exc)
                if self.connected:
                    self.inbox.put("down", self.last_error)
                self.connected = False
            finally:
                for closer in (ps, lst):
                    try:
                        if closer is not None:
                            closer.close()
                    except Exception:  # closing a broken connection may raise; it is gone either way
                        pass
            self._stop.wait(backoff)
            backoff = min(self.max_backoff, backoff * 2)

    def _follow(self, lst: RedisBanList, ps: Any) -> None:
        last_health = time.monotonic()
        while not self._stop.is_set():
            if self.inbox.overflowed:
                log.warning("ban list: the main loop fell behind; reloading the whole list")
                return
            self._send(lst)
            m = ps.get_message(timeout=POLL_S)
            now = time.monotonic()
            if m is None:
                if now - last_health >= self.health_every:  # a Redis that stopped answering is seen
                    ps.ping()
                    last_health = now
                continue
            last_health = now
            if m.get("type") != "message":
                continue
            data = m.get("data")
            ev = parse_event(data) if isinstance(data, (bytes, str)) else None
            if ev is not None:
                ev.received = now
                self.inbox.event(ev)

    def _send(self, lst: RedisBanList) -> None:
        while True:
            with self._olock:
                if not self._outbox:
                    return
                item = self._outbox.popleft()
            try:
                lst.add(
                    item["net"],
                    item["ttl"],
                    rule=item.get("rule", ""),
                    reason=item.get("reason", ""),
                    by=item.get("by", ""),
                    origin=item.get("origin", "network"),
                    extend=True,
                    repeat=item.get("repeat"),
                )
                self.published += 1
            except Exception:  # whatever failed: the item is kept for the next connection, then re-raised
                self.publish_failed += 1
                with self._olock:  # kept for the next connection
                    if len(self._outbox) < MAX_OUTBOX:
                        self._outbox.appendleft(item)
                raise
