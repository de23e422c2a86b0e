"""What the sidecar's HTTP/1.1 fast paths share: the connection base class,
the server state (live connections, answers batched per loop iteration), the
reply type the decision endpoints produce, and the protocol constants."""

from __future__ import annotations

import asyncio
import logging
import socket
from http import HTTPStatus
from typing import Any

from aiohttp import web

from ..limit.headers import PROBLEM_TYPE, simple_problem
from .httphead import http_date

log = logging.getLogger("netlimit.sidecar")

MAX_DELAY = 60.0
ADMIN_PREFIX = "/_netlimit"

# RFC 9110 §7.6.1: Connection and the fields it names, plus the classic
# hop-by-hop fields, are not forwarded.  Expect is answered by this hop.
HOP_BY_HOP = frozenset(
    (
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "proxy-authenticate",
        "proxy-authorization",
    )
)


class Reply:
    """A decision endpoint's answer, independent of the server that sends it."""

    __slots__ = ("status", "headers", "body", "delay")

    def __init__(self, status: int, headers: dict[str, str], body: str = "", delay: float = 0.0):
        self.status = status
        self.headers = headers
        self.body = body  # a problem+json document, or "" (no body)
        self.delay = delay  # leaky bucket queue mode: answer after this many seconds

    @classmethod
    def problem(cls, status: int, title: str, detail: str) -> Reply:
        return cls(status, {}, simple_problem(status, title, detail))

    async def response(self) -> web.Response:
        if self.delay > 0:
            await asyncio.sleep(self.delay)
        if self.body:
            return web.Response(status=self.status, text=self.body, content_type=PROBLEM_TYPE, headers=self.headers)
        return web.Response(status=self.status, headers=self.headers)


class ServerState:
    """The state of the running server, apart from the config-holding Sidecar:
    its fast-path connections (swept when idle, closed at shutdown) and the
    answers held back until the end of the current loop iteration (see
    ``FastCheckProtocol._write``)."""

    __slots__ = ("conns", "out_batch")

    def __init__(self) -> None:
        self.conns: set = set()
        self.out_batch: list | None = None

    def flush_out(self) -> None:
        """Write the answers held back in this loop iteration."""
        batch = self.out_batch
        if batch is None:  # already written (a connection handed to aiohttp)
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


IDLE_TIMEOUT = 75.0  # keep-alive connections idle longer are closed (aiohttp's default)
REASONS = {s.value: s.phrase for s in HTTPStatus}
STATUS_LINES = {c: f"HTTP/1.1 {c} {REASONS[c]}\r\n" for c in (200, 400, 403, 429, 500)}


def http_date_bytes() -> bytes:
    """The Date header value (formatted at most once per second), as bytes."""
    return http_date().encode("latin-1")


def set_nodelay(transport) -> None:
    """Small requests and replies go out at once, not after Nagle's delay."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass


class FastHTTPProtocol(asyncio.Protocol):
    """What the two fast paths (decision endpoints here, the proxy in proxy.py)
    share: registration for shutdown and idle sweeps, TCP_NODELAY, the running
    loop, and the one-way hand-off of a connection to aiohttp.  Subclasses set
    ``sc``, ``aio``, ``transport``, ``buf``, ``busy``, ``paused``, ``peer``,
    ``last`` and ``loop`` (None)."""

    __slots__ = ()
    sc: Any
    aio: Any
    transport: Any
    buf: bytes
    busy: bool
    paused: bool
    peer: str
    last: float
    loop: asyncio.AbstractEventLoop | None

    def connection_made(self, transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = peer[0] if peer else ""
        set_nodelay(transport)
        self.sc.state.conns.add(self)

    def eof_received(self) -> bool:
        return False

    def _handoff(self, buf: bytes) -> None:
        """Give the connection to aiohttp (with the unparsed bytes) for good."""
        t = self.transport
        state = self.sc.state
        if state.out_batch:  # answers of earlier requests first (aiohttp writes the next ones)
            state.flush_out()
        state.conns.discard(self)
        self.buf = b""
        self.busy = True  # nothing more for this protocol
        if self.paused:
            self.paused = 0
            t.resume_reading()
        proto = self.aio()
        proto.connection_made(t)
        t.set_protocol(proto)
        if buf:
            proto.data_received(buf)

    def _loop(self) -> asyncio.AbstractEventLoop:
        """The running loop, looked up once per connection: asyncio.get_running_loop()
        (also inside ensure_future) makes a getpid() system call on Python 3.11."""
        loop = self.loop
        if loop is None:
            loop = self.loop = asyncio.get_running_loop()
        return loop

    def close_if_idle(self, now: float) -> None:
        if not self.busy and now - self.last > IDLE_TIMEOUT and self.transport is not None:
            self.transport.close()
