"""A request body as it arrives: a bounded buffer the handler reads, which
pauses the connection's reading while it is full."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol

from .limits import ClientError, Limits


class _Counts(Protocol):
    @property
    def timeouts(self) -> dict[str, int]: ...


class Owner(Protocol):
    """What a body uses of its connection (connection.HttpConnection)."""

    @property
    def limits(self) -> Limits: ...

    @property
    def state(self) -> _Counts: ...

    def pause(self, why: str) -> None: ...

    def resume(self, why: str) -> None: ...

    def write_now(self, out: bytes) -> None: ...


class Asked(Protocol):
    """What a body uses of its request (head.Request): whether the client waits for 100 Continue."""

    expect_continue: bool
    continued: bool


CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class Body:
    """A request body as it arrives: a bounded buffer read by the handler."""

    __slots__ = ("conn", "req", "length", "chunks", "size", "done", "error", "waiter", "received", "discard")

    def __init__(self, conn: Owner, req: Asked, length: int | None):
        self.conn = conn
        self.req = req
        self.length = length  # Content-Length, or None when chunked
        self.chunks: deque[bytes] = deque()
        self.size = 0
        self.done = False
        self.error: BaseException | None = None
        self.waiter: asyncio.Future | None = None
        self.received = 0
        self.discard = False  # nobody will read it: drop what arrives

    def feed(self, data: bytes) -> None:
        self.received += len(data)
        if self.discard:
            return
        self.chunks.append(data)
        self.size += len(data)
        if self.size > self.conn.limits.max_body_buffer:
            self.conn.pause("body")
        self._wake()

    def end(self) -> None:
        self.done = True
        self._wake()

    def fail(self, exc: BaseException) -> None:
        if not self.done:
            self.error = exc
            self.done = True
            self._wake()

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def read(self) -> bytes:
        """The next part of the body; b"" at its end.  ClientError on a client
        that stops sending for ``body_timeout`` seconds or sends a broken body."""
        conn = self.conn
        req = self.req
        if req.expect_continue and not req.continued:
            req.continued = True
            conn.write_now(CONTINUE)
        while not self.chunks:
            if self.error is not None:
                raise self.error
            if self.done:
                return b""
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(self.waiter, conn.limits.body_timeout)
            except TimeoutError:
                conn.state.timeouts["body"] += 1
                raise ClientError(408, "the request body stopped arriving") from None
            finally:
                self.waiter = None
        data = self.chunks.popleft()
        self.size -= len(data)
        if self.size <= conn.limits.max_body_buffer // 2:
            conn.resume("body")
        return data

    async def read_all(self, limit: int, what: str = "the request body") -> bytes:
        """The whole body, or ClientError 413 beyond ``limit`` bytes."""
        if self.length is not None and self.length > limit:
            raise ClientError(413, f"{what} is limited to {limit} bytes")
        parts: list[bytes] = []
        n = 0
        while True:
            data = await self.read()
            if not data:
                return b"".join(parts)
            n += len(data)
            if n > limit:
                raise ClientError(413, f"{what} is limited to {limit} bytes")
            parts.append(data)
