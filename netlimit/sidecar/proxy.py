"""The reverse proxy: every request is decided, then forwarded to the one
upstream (or answered 429), its response relayed to the client.

What is forwarded is what was parsed, re-framed, never the client's raw bytes:

* the upstream request line is the configured origin's base path + the
  request's validated origin-form path and query (absolute-form requests give
  their path; nothing a client sends can change where the sidecar connects);
* framing is the sidecar's own: a body that arrived whole within
  ``request_buffer`` bytes goes with its ``Content-Length`` (nginx's
  ``proxy_request_buffering``: a slow upload does not hold an upstream
  connection), a longer one is streamed with its length, or chunked when the
  client chunked it; ``Content-Length`` and ``Transfer-Encoding`` are never
  hop-by-hop, whatever ``Connection`` names;
* hop-by-hop fields (RFC 9110 §7.6.1, and what ``Connection`` names) are
  dropped both ways -- but ``Connection`` never removes ``Host``,
  ``X-Forwarded-For``, ``Forwarded``, ``X-Real-IP``, ``Via`` nor a field a
  header action keys on (who the client is must reach the application);
  ``X-Forwarded-For`` gets the peer appended, ``Via`` ``1.1 netlimit``;
  everything else passes unchanged and in order;
* the upstream's response is parsed by llhttp too (httptools), and re-framed
  for the client: its length when known, else chunked (close-delimited for an
  HTTP/1.0 client); trailers and interim (1xx) responses are not relayed;
* upstream connections are reused (LIFO, at most ``MAX_IDLE`` idle, none idle
  longer than ``IDLE_UPSTREAM``); a request without a body that meets a pooled
  connection the upstream has just closed is retried once on a fresh one
  (idempotent methods only, RFC 9110 §9.2.2);
* unreachable upstream -> 502, no response head within ``upstream_timeout`` of
  the request's last byte (the clock does not run while the client uploads)
  -> 504, a broken response before its head -> 502, after its head -> the
  client connection is aborted (its response cannot be completed).

Both directions have flow control: a slow reader pauses the other side.
"""

from __future__ import annotations

import asyncio
import logging
import ssl as _ssl
import time
from collections import deque
from typing import Any
from urllib.parse import urlsplit

import httptools

from ..errors import NetlimitError
from ..limit.headers import rate_headers
from ..limit.limiter import OVER_LIMIT, CheckResult
from ..limit.request import CheckRequest
from ..logevery import LogEvery
from . import responses
from .app import Sidecar
from .http11.connection import HttpConnection
from .http11.head import Request

log = logging.getLogger("netlimit.sidecar")
_upstream_log = LogEvery(10.0)

MAX_IDLE = 256  # idle upstream connections kept
#: seconds an idle upstream connection is trusted: below the keep-alive timeouts
#: applications commonly have (Node's 5 s), so that a request seldom meets a
#: connection the upstream is closing at that moment (a body cannot be retried)
IDLE_UPSTREAM = 4.0
MAX_RESPONSE_HEAD = 64 * 1024
HIGH_WATER = 256 * 1024  # response bytes buffered from the upstream before its reading pauses
IDEMPOTENT = frozenset(("GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"))

# RFC 9110 §7.6.1: Connection and the fields it names, plus the classic hop-by-hop
# fields, are not forwarded; the framing fields are this hop's (re-framed); Expect
# is answered by this hop.
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
_NOT_FORWARDED = HOP_BY_HOP | {"content-length", "expect"}
_FRAMING = frozenset(("content-length", "transfer-encoding"))


class UpstreamError(NetlimitError):
    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status = status
        self.detail = detail


#: what ``Connection`` never removes from a request: who the client is (behind a front
#: proxy that passes Connection through, dropping these would make the proxy the
#: client to the application) and where it asked to go (issue 29)
_KEPT = _FRAMING | frozenset(("host", "x-forwarded-for", "forwarded", "x-real-ip", "via"))


def _dropped(fields: list[tuple[str, str]], base: frozenset[str], kept: frozenset[str] = _FRAMING) -> frozenset[str]:
    """``base`` plus the fields ``Connection`` names, except those of ``kept``
    (framing fields at least)."""
    named = {
        t.strip().lower() for k, v in fields if k.lower() == "connection" for t in v.split(",") if t.strip()
    } - kept
    return base | named if named else base


# --- the upstream ----------------------------------------------------------------------


class Origin:
    """Where the one upstream is: scheme, host, port, base path (from --upstream only)."""

    def __init__(self, url: str):
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname or u.username or u.password or u.query:
            raise ValueError(f"--upstream {url!r}: expected http[s]://HOST[:PORT][/BASE], e.g. http://127.0.0.1:8080")
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.ssl = _ssl.create_default_context() if u.scheme == "https" else None
        self.base = u.path.rstrip("/")
        self.url = url


class UpstreamConn(asyncio.Protocol):
    """One connection to the upstream; one response at a time, parsed by llhttp."""

    def __init__(self, pool: UpstreamPool):
        self.pool = pool
        self.transport: Any = None
        self.parser: Any = None
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self.head_done = False
        self.head_only = False
        self.length: int | None = None  # Content-Length of the response, when it has one
        self.chunks: deque[bytes] = deque()
        self.size = 0
        self.complete = False
        self.reusable = True
        self.error: UpstreamError | None = None
        self.waiter: asyncio.Future | None = None
        self.write_paused = False
        self._drained: asyncio.Future | None = None
        self.idle_since = 0.0
        self.in_pool = False  # idle in the pool (else in use, or to be closed by its user)
        self.got_bytes = False
        self._head_bytes = 0
        self._interim = False

    # -- protocol --------------------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            import socket

            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        if self.parser is None:  # bytes nobody asked for: the connection is not trustworthy
            self.reusable = False
            self.transport.close()
            return
        if not self.head_done:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_RESPONSE_HEAD + len(data):
                return self._fail(UpstreamError(502, "the upstream application sent an oversized response head"))
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            log.debug("invalid upstream response: %s", exc)
            self._fail(UpstreamError(502, "the upstream application sent an invalid response"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        if self.parser is not None and not self.complete:
            if self.head_done and self.length is None and not self._chunked():
                self.complete = True  # a close-delimited body ends here
            elif self.head_done:
                self._fail(UpstreamError(502, "the upstream application closed the connection mid-response"))
            else:
                self._fail(UpstreamError(502, "the upstream application closed the connection before answering"))
        self._wake()
        if self._drained is not None and not self._drained.done():
            self._drained.set_exception(ConnectionResetError("upstream closed"))

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    async def drain(self, timeout: float) -> None:
        """Wait while the upstream does not read what we send, at most ``timeout``."""
        if self.write_paused:
            self._drained = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(self._drained, timeout)
            except TimeoutError:
                raise UpstreamError(504, "the upstream application stopped reading the request") from None
            finally:
                self._drained = None

    # -- llhttp callbacks --------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.headers = []
        self._interim = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # interim (100 Continue, 103 Early Hints): not relayed
            self._interim = True
            return
        self.status = status
        self.head_done = True
        if not self.parser.should_keep_alive():
            self.reusable = False
        for k, v in self.headers:
            if k.lower() == "content-length":
                self.length = int(v)
        if self.head_only or status in (204, 304):
            self.length = 0
        if self.head_only:
            # llhttp would wait for the body a HEAD response announces: this
            # connection cannot carry another response
            self.reusable = False
            self.complete = True
            self.parser = None
        self._wake()

    def on_body(self, data: bytes) -> None:
        if self._interim:
            return
        self.chunks.append(data)
        self.size += len(data)
        if self.size > HIGH_WATER:
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self._interim:
            return
        self.complete = True
        self._wake()

    # -- the exchange ------------------------------------------------------------------------

    def _chunked(self) -> bool:
        return any(k.lower() == "transfer-encoding" for k, _ in self.headers)

    def _fail(self, err: UpstreamError) -> None:
        if self.error is None and not self.complete:
            self.error = err
        self.reusable = False
        if self.transport is not None:
            self.transport.close()
        self._wake()

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def start(self, head_only: bool) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers = []
        self.head_done = self.complete = False
        self.head_only = head_only
        self.length = None
        self.chunks.clear()
        self.size = 0
        self.error = None
        self.got_bytes = False
        self._head_bytes = 0

    async def wait(self, timeout: float | None) -> None:
        """Until something happens (a head, body bytes, the end), at most ``timeout``
        (None: no limit, for while the client is still uploading)."""
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(self.waiter, timeout)
        except TimeoutError:
            raise UpstreamError(504, "the upstream application did not answer in time") from None
        finally:
            self.waiter = None

    def take(self) -> bytes:
        data = b"".join(self.chunks)
        self.chunks.clear()
        if self.size > HIGH_WATER and self.transport is not None:
            self.transport.resume_reading()
        self.size = 0
        return data

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class UpstreamPool:
    """Connections to the one upstream of this sidecar."""

    def __init__(self, origin: Origin, *, connect_timeout: float = 5.0, read_timeout: float = 300.0):
        self.origin = origin
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.idle: list[UpstreamConn] = []
        self.closed = False

    def take(self) -> UpstreamConn | None:
        idle = self.idle
        now = time.monotonic()
        while idle:
            c = idle.pop()
            c.in_pool = False
            if c.transport is not None and not c.transport.is_closing() and now - c.idle_since < IDLE_UPSTREAM:
                return c
            c.close()
        return None

    async def connect(self) -> UpstreamConn:
        loop = asyncio.get_running_loop()
        o = self.origin
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: UpstreamConn(self), o.host, o.port, ssl=o.ssl), self.connect_timeout
            )
        except TimeoutError:
            raise UpstreamError(504, "the upstream application did not answer in time") from None
        except (OSError, _ssl.SSLError) as exc:
            raise UpstreamError(502, "the upstream application is unreachable") from exc
        return conn

    def give_back(self, c: UpstreamConn) -> None:
        if (
            self.closed
            or not c.reusable
            or len(self.idle) >= MAX_IDLE
            or c.transport is None
            or c.transport.is_closing()
        ):
            c.close()
            return
        c.parser = None
        c.idle_since = time.monotonic()
        c.in_pool = True
        self.idle.append(c)

    def close(self) -> None:
        self.closed = True
        for c in self.idle:
            c.in_pool = False
            c.close()
        self.idle.clear()


# --- the handler ------------------------------------------------------------------------


class Proxy:
    """The client-facing handler of proxy mode: decide, then forward or 429."""

    wanted: frozenset[str] | None = None  # every field: they are forwarded

    def __init__(self, sc: Sidecar, pool: UpstreamPool, *, request_buffer: int = 1024 * 1024):
        self.sc = sc
        self.pool = pool
        self.request_buffer = request_buffer
        self._kept: frozenset[str] | None = None
        self._kept_plan: object = None

    def bad_request(self) -> None:
        self.sc.front.request("proxy", "bad_request")

    def handle(self, conn: HttpConnection, req: Request) -> Any:
        sc = self.sc
        path_of = sc.plan.path_of
        descs = sc.descriptors(conn.peer, req.fields, req.method, lambda: path_of(req.path), req.xff)
        lim = sc.limiter
        if lim.is_sync:
            result = lim.check_nowait(CheckRequest.simple(lim.rules.domain, descs))
            if result.code == OVER_LIMIT:
                return self._denied(req, result)
            return self._forward(conn, req, result)
        return self._decide_then_forward(conn, req, descs)

    def _denied(self, req: Request, result: CheckResult) -> bytes:
        self.sc.front.request("proxy", "over_limit")
        if req.body is not None and not req.body.done:
            req.keep = False  # its upload is not read: the connection ends after the answer
        return responses.decision_reply(result).encode(req.keep, req.http10)

    async def _decide_then_forward(self, conn: HttpConnection, req: Request, descs: list) -> bytes | None:
        lim = self.sc.limiter
        result = await lim.check(CheckRequest.simple(lim.rules.domain, descs))
        if result.code == OVER_LIMIT:
            return self._denied(req, result)
        return await self._forward(conn, req, result)

    async def _forward(self, conn: HttpConnection, req: Request, result: CheckResult) -> bytes | None:
        sc = self.sc
        rh = rate_headers(result)
        if result.delay > 0:
            await asyncio.sleep(min(result.delay, responses.MAX_DELAY))
        # the body, buffered up to request_buffer before any upstream connection is used
        body = req.body
        buffered: list[bytes] = []
        n = 0
        whole = body is None
        if body is not None:
            while n <= self.request_buffer:
                part = await body.read()
                if not part:
                    whole = True
                    break
                buffered.append(part)
                n += len(part)
        length = n if whole and body is not None else (body.length if body is not None else None)
        head = self._request_head(conn, req, length)
        retry = whole and body is None and req.method in IDEMPOTENT
        up: UpstreamConn | None = None
        try:
            try:
                for attempt in (0, 1):
                    up, pooled = await self._send(req, head, buffered, whole, fresh=attempt > 0)
                    if not whole:
                        assert body is not None
                        await self._stream_body(up, body, chunked=body.length is None)
                    try:
                        return await self._relay(conn, req, up, rh)
                    except UpstreamError:
                        # a pooled connection the upstream closed while it was idle: once more, fresh
                        if attempt == 0 and pooled and retry and not up.got_bytes:
                            up.close()
                            continue
                        raise
                raise AssertionError("unreachable")
            except BaseException:  # re-raised: the cleanup runs for every early end, cancellation included
                # whatever ended the exchange early (the upstream failed, the client went
                # away or was aborted by a timeout): this upstream connection is not reused
                if up is not None and not up.in_pool:
                    up.close()
                raise
        except UpstreamError as exc:
            sc.front.request("proxy", "upstream_error")
            held = _upstream_log.due(exc.detail) if exc.status == 502 else -1
            if held >= 0:  # clients can provoke these (an abandoned upload): at most one line per 10 s
                more = f" ({held} more since the last report)" if held else ""
                log.warning("upstream %s: %s%s", self.pool.origin.url, exc.detail, more)
            return responses.problem(
                exc.status, responses.REASONS[exc.status], exc.detail, rh, keep=req.keep, http10=req.http10
            )

    def _request_head(self, conn: HttpConnection, req: Request, length: int | None) -> bytes:
        plan = self.sc.plan
        kept = self._kept
        if kept is None or self._kept_plan is not plan:  # and the fields a rule keys on (per reload)
            kept = self._kept = _KEPT | plan.header_names
            self._kept_plan = plan
        drop = _dropped(req.headers, _NOT_FORWARDED, kept)
        lines = [f"{req.method} {self.pool.origin.base}{req.path}{'?' + req.query if req.query else ''} HTTP/1.1\r\n"]
        # X-Forwarded-For and Via are extended where they first appear (several field
        # lines are one list: RFC 9110 §5.3), else added at the end
        xff: list[str] = []
        via: list[str] = []
        at: dict[str, int] = {}
        for k, v in req.headers:
            kl = k.lower()
            if kl in drop:
                continue
            if kl == "x-forwarded-for" or kl == "via":
                (xff if kl == "x-forwarded-for" else via).append(v)
                if kl in at:
                    continue
                at[kl] = len(lines)
                lines.append(k)
                continue
            lines.append(f"{k}: {v}\r\n")
        xff.append(conn.peer)
        via.append("1.0 netlimit" if req.http10 else "1.1 netlimit")
        for kl, name, values in (("x-forwarded-for", "X-Forwarded-For", xff), ("via", "Via", via)):
            if kl in at:
                lines[at[kl]] = f"{lines[at[kl]]}: {', '.join(values)}\r\n"
            else:
                lines.append(f"{name}: {', '.join(values)}\r\n")
        if req.body is not None:
            lines.append(f"Content-Length: {length}\r\n" if length is not None else "Transfer-Encoding: chunked\r\n")
        lines.append("\r\n")
        return "".join(lines).encode("latin-1")

    async def _send(
        self, req: Request, head: bytes, buffered: list[bytes], whole: bool, fresh: bool
    ) -> tuple[UpstreamConn, bool]:
        """The request head and what is buffered of its body, on a pooled (unless
        ``fresh``) or new connection; (connection, whether it was pooled)."""
        pool = self.pool
        chunked = not whole and req.body is not None and req.body.length is None
        body = b"".join(buffered)
        if chunked and body:
            body = _chunk(body)
        up = None if fresh else pool.take()
        pooled = up is not None
        if up is None:
            up = await pool.connect()
        up.start(head_only=req.method == "HEAD")
        up.transport.write(head + body)
        return up, pooled

    async def _stream_body(self, up: UpstreamConn, body: Any, chunked: bool) -> None:
        """The rest of the body, as it comes; stops when the upstream answers first
        (e.g. 413 before reading an upload: its answer is relayed, and the client
        connection ends after it).  While the client uploads, its own
        ``body_timeout`` runs, not the upstream's: the upstream timeout starts
        from the body's last byte (in _relay), or when the upstream stops reading."""
        timeout = self.pool.read_timeout
        while True:
            if up.head_done or up.error is not None:
                return
            read = asyncio.ensure_future(body.read())
            answered = asyncio.ensure_future(up.wait(None))
            try:
                await asyncio.wait((read, answered), return_when=asyncio.FIRST_COMPLETED)
            finally:
                for f in (read, answered):
                    if not f.done():
                        f.cancel()
            if not read.done() or read.cancelled():
                await asyncio.gather(read, answered, return_exceptions=True)
                return
            answered.cancel()
            await asyncio.gather(answered, return_exceptions=True)
            part = read.result()
            if up.transport is None or up.transport.is_closing():
                return  # the upstream went away: _relay says how
            if not part:
                if chunked:
                    up.transport.write(b"0\r\n\r\n")
                return
            up.transport.write(_chunk(part) if chunked else part)
            await up.drain(timeout)

    async def _relay(self, conn: HttpConnection, req: Request, up: UpstreamConn, rh: dict[str, str]) -> bytes | None:
        sc = self.sc
        timeout = self.pool.read_timeout
        while not up.head_done:
            if up.error is not None:
                raise up.error
            await up.wait(timeout)
        if up.error is not None:
            raise up.error
        keep = req.keep and (req.body is None or req.body.done)  # an unread upload ends the connection
        # the client's framing: the upstream's length, else chunked (HTTP/1.1) or close
        drop = _dropped(up.headers, HOP_BY_HOP | {"content-length"})
        headers = [(k, v) for k, v in up.headers if k.lower() not in drop and k not in rh]
        headers.extend(rh.items())
        chunk_out = False
        no_body = req.method == "HEAD" or up.status in (204, 304)
        if up.status in (204, 304):
            framing = ""
        elif req.method == "HEAD":
            cl = next((v for k, v in up.headers if k.lower() == "content-length"), None)
            framing = f"Content-Length: {cl}\r\n" if cl is not None else ""
        elif up.length is not None:
            framing = f"Content-Length: {up.length}\r\n"
        elif req.http10:
            framing, keep = "", False  # close-delimited
        else:
            framing, chunk_out = "Transfer-Encoding: chunked\r\n", True
        if not keep:
            req.keep = False
            framing += "Connection: close\r\n"
        elif req.http10:
            framing += "Connection: keep-alive\r\n"
        conn.write_now(
            responses.status_line(up.status) + responses.encode_headers(headers) + framing.encode("latin-1") + b"\r\n"
        )
        try:
            while True:
                data = up.take()
                if data:
                    if not no_body:
                        conn.write_now(_chunk(data) if chunk_out else data)
                        await conn.drain()
                    continue  # more may have arrived (and the end) while the client drained
                if up.complete:
                    break
                if up.error is not None:
                    raise up.error
                await up.wait(timeout)
        except (UpstreamError, ConnectionError):
            # the response cannot be completed: the client must not take a cut one for whole
            sc.front.request("proxy", "upstream_error")
            up.close()
            if conn.transport is not None:
                conn.transport.abort()
            return None
        if chunk_out:
            conn.write_now(b"0\r\n\r\n")
        self.pool.give_back(up)
        sc.front.request("proxy", "ok")
        return None


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)
