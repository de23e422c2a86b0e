"""A running listener's state (:class:`ServerState`): its connections, the
sweep of their timeouts, the shedding at the connection cap, the answers
batched per loop iteration, and the counts /metrics shows.  The connections
are connection.HttpConnection objects (typed loosely here: that module
imports this one)."""

from __future__ import annotations

import logging
import time
from typing import Any

from .limits import ClientError

log = logging.getLogger("netlimit.sidecar")
_monotonic = time.monotonic


class ServerState:
    """The running listener, apart from the config-holding Sidecar: its client
    connections (swept for timeouts, the oldest idle or slowest one shed at the
    cap, closed at shutdown), what happened to them (counted for /metrics), and
    the answers held back until the end of the current loop iteration (see
    :meth:`HttpConnection.write`).  Each listener has its own, so a flood on
    one cannot take the other's connections."""

    __slots__ = (
        "conns", "out_batch", "max_connections", "shed", "refused", "timeouts", "queued_max", "errors", "plans",
    )  # fmt: skip

    def __init__(self, max_connections: int = 10_000) -> None:
        self.conns: dict[Any, None] = {}  # insertion order: the oldest first
        self.out_batch: list[tuple[Any, bytes, bool]] | None = None
        self.max_connections = max_connections
        self.shed = 0  # connections closed to make room
        self.refused = 0  # new connections refused: every one was busy
        self.timeouts = {"header": 0, "body": 0, "keepalive": 0, "send": 0}
        self.queued_max = 0  # the most requests one connection had queued at once
        self.errors = 0  # requests answered 500 because the sidecar failed
        #: bumped at each reload (Sidecar.reload): only then may a handler read other
        #: fields (Handler.wanted), so only then do the connections ask it again
        self.plans = 0

    def add(self, conn: Any) -> bool:
        """Register a new connection; at the cap, shed the one that has been waiting on
        its client the longest -- idle between requests, or in the middle of a
        request head (a slow client: not idle, but given nothing yet) -- and refuse
        the new one (False) when every connection is busy being answered.  A
        connection just accepted has waited the least, so it is not shed for the
        next one; a head trickling in for seconds goes before an idle keep-alive
        connection that answered a moment ago."""
        if len(self.conns) >= self.max_connections:
            victim = None
            oldest = _monotonic()
            for c in self.conns:
                if c.in_head:
                    if c.paused or c.queue:
                        continue
                    since = c.head_since
                elif c.cur is None and not c.queue and c.task is None:
                    since = c.last
                else:
                    continue
                if since < oldest:
                    victim, oldest = c, since
            if victim is None:
                self.refused += 1
                return False
            self.shed += 1
            self.conns.pop(victim, None)
            victim.abort()
        self.conns[conn] = None
        return True

    def sweep(self, now: float) -> None:
        """Close what overstayed: a request head slower than ``header_timeout`` (408),
        an idle keep-alive connection older than ``keepalive_timeout``, answers
        that left nothing for ``send_timeout`` (aborted).  Run about twice a
        second by the server: per-connection clocks, no timer per request."""
        for c in list(self.conns):
            lim = c.limits
            t = c.transport
            if t is None:
                continue
            unsent = t.get_write_buffer_size()
            if unsent:
                sent = c.out_total - unsent
                if sent != c.sent_mark:
                    c.sent_mark, c.send_since = sent, now
                elif now - c.send_since > lim.send_timeout:
                    self.timeouts["send"] += 1
                    c.abort()
                    continue
            else:
                c.send_since = now
            if c.closing:
                continue
            if c.in_head:
                if not c.paused and now - c.head_since > lim.header_timeout:
                    self.timeouts["header"] += 1
                    c.refuse(ClientError(408, "the request head did not arrive in time"))
            elif c.idle and c.task is None and now - c.last > lim.keepalive_timeout:
                self.timeouts["keepalive"] += 1
                c.close()

    def flush_out(self) -> None:
        """Write the answers held back in this loop iteration."""
        batch = self.out_batch
        if batch is None:
            return
        self.out_batch = None
        for t, out, close in batch:
            if not t.is_closing():
                try:
                    t.write(out)
                    if close:
                        t.close()
                except Exception:  # a transport gone under us: the others still go out
                    log.debug("answer not written", exc_info=True)
