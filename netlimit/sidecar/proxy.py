"""Reverse-proxy fast path: plain asyncio protocols on both sides, a keep-alive
pool of upstream connections.

The aiohttp proxy (``Sidecar.proxy``: an aiohttp server request, a ClientSession
request, a StreamResponse, two tasks per request) cost about 0.5 ms of CPU per
request, so with one client connection the sidecar added ~0.5 ms at the median
and tens of milliseconds at p99 on a loaded machine.  Here a request that is
plain HTTP/1.1 -- origin-form target, no Transfer-Encoding, no Expect, no
Upgrade, an optional Content-Length body -- is checked and forwarded from
``data_received`` without a task (when the store is in-process and an idle
upstream connection is pooled), and the upstream's response is relayed as it
arrives:

* request and response bodies stream both ways with flow control (a slow
  reader pauses the other side's reads), never buffered whole;
* upstream connections are reused (TCP_NODELAY, LIFO, at most ``MAX_IDLE``
  idle, none idle longer than ``IDLE_UPSTREAM``); a request without a body
  that meets a pooled connection the upstream has just closed is retried once
  on a fresh connection (idempotent methods only, RFC 9110 §9.2.2);
* hop-by-hop fields (RFC 9110 §7.6.1, and whatever ``Connection`` names) are
  dropped both ways; ``X-Forwarded-For`` gets the peer appended, ``Via`` gets
  ``1.1 netlimit``; everything else passes unchanged and in order;
* chunked responses pass through as they are (the parser only finds their
  end), a response delimited by the upstream closing is re-chunked so the
  client connection stays usable;
* upstream unreachable → 502, no response head within the read timeout → 504,
  a broken response before its head → 502, a broken response after its head
  → the client connection is aborted (its response cannot be completed).

Anything else is handed, with every byte read so far, to aiohttp for the rest
of the connection (``Sidecar.proxy`` and the admin endpoints under
``/_netlimit/``), exactly as the decision fast path does.
"""

from __future__ import annotations

import asyncio
import logging
import ssl as _ssl
import time

from yarl import URL

from ..limit.actions import path_of_uri
from ..limit.headers import PROBLEM_TYPE, problem_body, rate_headers
from ..limit.limiter import OVER_LIMIT
from ..limit.request import CheckRequest
from .httphead import MAX_HEAD, parse_request
from .protocol import ADMIN_PREFIX, HOP_BY_HOP, MAX_DELAY, FastHTTPProtocol, Reply, http_date_bytes, set_nodelay

log = logging.getLogger("netlimit.sidecar")

MAX_IDLE = 256  # idle upstream connections kept
IDLE_UPSTREAM = 30.0  # seconds an idle upstream connection is trusted (as the old TCPConnector)
MAX_RESPONSE_HEAD = 65536  # upstream response head
MAX_CHUNK_LINE = 4096  # chunk-size line (with extensions) or one trailer line
LINGER = 2.0  # seconds an unwanted request body is read and dropped before closing
HIGH_WATER = 256 * 1024  # request body bytes buffered while the upstream connection is being made
IDEMPOTENT = frozenset(("GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"))

_NONE, _LENGTH, _CHUNKED, _CLOSE = range(4)
# chunked parser states
_C_SIZE, _C_DATA, _C_DATA_END, _C_TRAILER = range(4)

_EXTRA_HOP = HOP_BY_HOP | {"expect"}


class UpstreamError(Exception):
    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status = status
        self.detail = detail


def _tokens(value: str) -> set[str]:
    return {t.strip().lower() for t in value.split(",") if t.strip()}


# --- upstream side ----------------------------------------------------------------------------


class UpstreamPool:
    """Connections to the one upstream of this sidecar."""

    def __init__(self, url: URL, *, connect_timeout: float = 5.0, read_timeout: float = 300.0):
        if url.scheme not in ("http", "https"):
            raise ValueError(f"upstream {url}: only http:// and https:// are supported")
        self.host = url.raw_host or "127.0.0.1"
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.ssl = _ssl.create_default_context() if url.scheme == "https" else None
        self.base = (url.raw_path or "").rstrip("/")
        h = url.raw_host or ""
        if ":" in h:
            h = f"[{h}]"
        self.hostport = h if url.port is None or url.is_default_port() else f"{h}:{url.port}"
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.idle: list[UpstreamConn] = []
        self.closed = False

    def take(self) -> UpstreamConn | None:
        idle = self.idle
        if not idle:
            return None
        now = time.monotonic()
        while idle:
            c = idle.pop()
            if c.transport is not None and not c.transport.is_closing() and now - c.idle_since < IDLE_UPSTREAM:
                return c
            c.close()
        return None

    async def connect(self) -> UpstreamConn:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: UpstreamConn(self), self.host, self.port, ssl=self.ssl),
                self.connect_timeout,
            )
        except TimeoutError:
            raise UpstreamError(504, "the upstream application did not answer in time") from None
        except (OSError, _ssl.SSLError) as exc:
            log.warning("upstream %s:%s: %r", self.host, self.port, exc)
            raise UpstreamError(502, "the upstream application is unreachable") from None
        return conn

    def release(self, c: UpstreamConn) -> None:
        if self.closed or len(self.idle) >= MAX_IDLE or c.transport is None or c.transport.is_closing():
            c.close()
            return
        c.idle_since = time.monotonic()
        self.idle.append(c)

    def discard(self, c: UpstreamConn) -> None:
        try:
            self.idle.remove(c)
        except ValueError:
            pass

    def close(self) -> None:
        self.closed = True
        for c in self.idle:
            c.close()
        self.idle.clear()


class UpstreamConn(asyncio.Protocol):
    """One upstream connection; while a request is in flight it parses the
    response and feeds it to its client (a FastProxyProtocol)."""

    def __init__(self, pool: UpstreamPool):
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.client: FastProxyProtocol | None = None
        self.idle_since = 0.0
        self.used = 0  # requests sent on this connection
        self.got = False  # any response byte for the current request
        self.head_done = False
        self.hbuf = b""
        self.mode = _NONE
        self.left = 0  # _LENGTH: body bytes to come; _CHUNKED: data bytes of this chunk
        self.cstate = _C_SIZE
        self.line = b""  # partial chunk-size / trailer line
        self.keep = True  # the upstream allows reuse
        self.head_only = False
        self.reading_paused = False
        self.timer: asyncio.TimerHandle | None = None
        self.last_rx = 0.0
        self.loop: asyncio.AbstractEventLoop | None = None

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.loop = asyncio.get_running_loop()  # once (a getpid() per call on Python 3.11)
        set_nodelay(transport)

    def connection_lost(self, exc) -> None:
        self.transport = None
        self._cancel_timer()
        c = self.client
        if c is None:
            self.pool.discard(self)
            return
        if self.head_done and self.mode == _CLOSE:
            self.client = None
            c.up_body_close_end()
            return
        self.client = None
        c.up_lost(self, self.head_done, self.got)

    def pause_writing(self) -> None:  # request body backpressure
        if self.client is not None:
            self.client.pause_reading(2)

    def resume_writing(self) -> None:
        if self.client is not None:
            self.client.resume_reading(2)

    def data_received(self, data: bytes) -> None:
        c = self.client
        if c is None:  # an idle connection must not talk
            self.close()
            return
        self.got = True
        self.last_rx = time.monotonic()
        try:
            self._feed(data, c)
            if c.hpend and self.client is c:
                c.flush_head()  # the head alone (its body comes later)
        except UpstreamError as exc:
            self.keep = False
            self.client = None
            self.close()
            c.up_failed(exc, self.head_done)

    # -- one exchange --------------------------------------------------------------------

    def start(self, client: FastProxyProtocol, data: bytes, head_only: bool) -> None:
        self.client = client
        self.used += 1
        self.got = False
        self.head_done = False
        self.hbuf = b""
        self.mode = _NONE
        self.keep = True
        self.head_only = head_only
        self.last_rx = time.monotonic()
        self.timer = self.loop.call_later(self.pool.read_timeout, self._on_timer)  # type: ignore[union-attr]
        self.transport.write(data)  # type: ignore[union-attr]

    def _on_timer(self) -> None:
        self.timer = None
        c = self.client
        if c is None:
            return
        quiet = time.monotonic() - self.last_rx
        if quiet < self.pool.read_timeout:
            self.timer = self.loop.call_later(
                self.pool.read_timeout - quiet,  # type: ignore[union-attr]
                self._on_timer,
            )
            return
        self.client = None
        self.keep = False
        self.close()
        c.up_failed(UpstreamError(504, "the upstream application did not answer in time"), self.head_done)

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _finish(self, c: FastProxyProtocol, extra: bool) -> None:
        self._cancel_timer()
        self.client = None
        if self.reading_paused:
            self.reading_paused = False
            if self.transport is not None:
                self.transport.resume_reading()
        if self.keep and not extra and c.body_left == 0:
            self.pool.release(self)
        else:
            self.close()
        c.up_done()

    def close(self) -> None:
        self._cancel_timer()
        if self.transport is not None:
            self.transport.close()

    def _feed(self, data: bytes, c: FastProxyProtocol) -> None:
        if not self.head_done:
            data = self._head(data, c)
            if data is None:
                return
        mode = self.mode
        if mode == _LENGTH:
            n = self.left
            if len(data) < n:
                self.left = n - len(data)
                c.up_body(data)
                return
            self.left = 0
            if n:
                c.up_body(data if len(data) == n else data[:n])
            self._finish(c, len(data) > n)
        elif mode == _CHUNKED:
            end = self._chunks(data)
            if end < 0:
                c.up_body(data)
                return
            c.up_body(data if end == len(data) else data[:end])
            self._finish(c, end < len(data))
        elif mode == _CLOSE:
            if data:
                c.up_body_rechunk(data)
        else:
            self._finish(c, bool(data))

    def _head(self, data: bytes, c: FastProxyProtocol) -> bytes | None:
        """Parse the response head (skipping 1xx interim responses); return the
        bytes after it, or None when the head is not complete yet."""
        buf = self.hbuf + data if self.hbuf else data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_RESPONSE_HEAD:
                    raise UpstreamError(502, "the upstream application sent an invalid response")
                self.hbuf = buf
                return None
            head = buf[:end].decode("latin-1")
            buf = buf[end + 4 :]
            lines = head.split("\r\n")
            st = lines[0].split(" ", 2)
            if len(st) < 2 or not st[0].startswith("HTTP/1.") or len(st[1]) != 3 or not st[1].isdigit():
                raise UpstreamError(502, "the upstream application sent an invalid response")
            code = int(st[1])
            if code < 100:
                raise UpstreamError(502, "the upstream application sent an invalid response")
            if code < 200:
                if code == 101:  # never asked for: requests with Upgrade go to aiohttp
                    raise UpstreamError(502, "the upstream application switched protocols unasked")
                continue  # 100 / 102 / 103: interim, dropped
            break
        self.hbuf = b""
        reason = st[2] if len(st) > 2 else ""
        hs: list[tuple[str, str, str]] = []
        conn_tokens: set[str] | None = None
        cl: str | None = None
        te: str | None = None
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name[-1] in " \t" or line[0] in " \t":
                raise UpstreamError(502, "the upstream application sent an invalid response")
            k = name.lower()
            value = value.strip(" \t")
            if k == "content-length":
                if not value.isdigit() or (cl is not None and cl != value):
                    raise UpstreamError(502, "the upstream application sent an invalid response")
                cl = value
            elif k == "transfer-encoding":
                te = value if te is None else f"{te}, {value}"
            elif k == "connection":
                conn_tokens = _tokens(value) if conn_tokens is None else conn_tokens | _tokens(value)
            hs.append((name, value, k))
        if st[0] != "HTTP/1.1" or (conn_tokens is not None and "close" in conn_tokens):
            self.keep = False
        if self.head_only or code == 204 or code == 304:
            self.mode = _NONE
        elif te is not None:
            if te.lower().rsplit(",", 1)[-1].strip() == "chunked":
                self.mode = _CHUNKED
                self.cstate = _C_SIZE
                self.left = 0
                self.line = b""
            else:
                self.mode = _CLOSE
                self.keep = False
        elif cl is not None:
            self.mode = _LENGTH
            self.left = int(cl)
        else:
            self.mode = _CLOSE
            self.keep = False
        self.head_done = True
        c.up_head(code, reason, hs, conn_tokens, self.mode)
        return buf

    def _chunks(self, data: bytes) -> int:
        """Advance the chunked parser over data; the index just past the end of
        the message, or -1 when the message continues."""
        i = 0
        n = len(data)
        while i < n:
            s = self.cstate
            if s == _C_DATA:
                take = min(self.left, n - i)
                i += take
                self.left -= take
                if self.left == 0:
                    self.cstate = _C_DATA_END
                    self.line = b""
                continue
            j = data.find(b"\n", i)
            if j < 0:
                self.line += data[i:]
                if len(self.line) > MAX_CHUNK_LINE:
                    raise UpstreamError(502, "the upstream application sent an invalid response")
                return -1
            line = self.line + data[i : j + 1]
            self.line = b""
            i = j + 1
            if len(line) > MAX_CHUNK_LINE:
                raise UpstreamError(502, "the upstream application sent an invalid response")
            if s == _C_SIZE:
                size = line.split(b";", 1)[0].strip()
                try:
                    self.left = int(size, 16)
                except ValueError:
                    raise UpstreamError(502, "the upstream application sent an invalid response") from None
                if not size or size[:1] in (b"-", b"+") or self.left < 0:
                    raise UpstreamError(502, "the upstream application sent an invalid response")
                self.cstate = _C_DATA if self.left else _C_TRAILER
            elif s == _C_DATA_END:
                if line.strip():
                    raise UpstreamError(502, "the upstream application sent an invalid response")
                self.cstate = _C_SIZE
            elif not line.strip():  # trailer section: ends with an empty line
                return i
        return -1


# --- client side ------------------------------------------------------------------------------

_RL_LOWER = {}


def _lower_keys(rh: dict[str, str]) -> frozenset[str]:
    key = tuple(rh)
    s = _RL_LOWER.get(key)
    if s is None:
        s = _RL_LOWER[key] = frozenset(k.lower() for k in rh)
    return s


class FastProxyProtocol(FastHTTPProtocol):
    """The client side of the proxy fast path (one request in flight per
    connection; pipelined requests wait in the buffer)."""

    def __init__(self, sc, aio_factory, pool: UpstreamPool) -> None:
        self.sc = sc
        self.aio = aio_factory
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.busy = False
        self.peer = ""
        self.last = time.monotonic()
        self.loop: asyncio.AbstractEventLoop | None = None  # FastHTTPProtocol._loop
        self.paused = 0  # reasons reading is paused: 1 buffer full, 2 upstream busy, 4 waiting
        self.write_paused = False
        # the request in flight
        self.up: UpstreamConn | None = None
        self.keep = True
        self.head_only = False
        self.method = "GET"
        self.body_left = 0  # request body bytes still to come from the client
        self.pending: list[bytes] = []  # request bytes waiting for an upstream connection
        self.pending_size = 0
        self.discarding = False  # a 429 was sent: swallow the rest of the body
        self.rh: dict[str, str] = {}
        self.sent_head = False
        self.hpend = b""
        self.rechunk = False
        self.replayable = False  # the whole request is in `sent` (can be retried)
        self.sent = b""
        self.retried = False
        self.closed = False
        self.lingering = False

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.sc.state.conns.discard(self)
        self.buf = b""
        self.pending = []
        up = self.up
        if up is not None:  # mid-exchange: the upstream connection cannot be reused
            self.up = None
            up.client = None
            up.close()

    def pause_writing(self) -> None:  # response backpressure
        self.write_paused = True
        up = self.up
        if up is not None and not up.reading_paused and up.transport is not None:
            up.reading_paused = True
            up.transport.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        up = self.up
        if up is not None and up.reading_paused and up.transport is not None:
            up.reading_paused = False
            up.transport.resume_reading()

    def pause_reading(self, why: int) -> None:
        if not self.paused and self.transport is not None:
            self.transport.pause_reading()
        self.paused |= why

    def resume_reading(self, why: int) -> None:
        if self.paused & why:
            self.paused &= ~why
            if not self.paused and self.transport is not None and not self.closed:
                self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        self.last = time.monotonic()
        if self.lingering:
            return
        n = self.body_left
        if n:
            if len(data) <= n:
                self.body_left = n - len(data)
                self._body(data)
                return
            self.body_left = 0
            self._body(data[:n])
            data = data[n:]
        self.buf = self.buf + data if self.buf else data
        if not self.busy:
            self._process()
        elif len(self.buf) > 4 * MAX_HEAD:
            self.pause_reading(1)

    def _body(self, data: bytes) -> None:
        if self.discarding:
            return
        up = self.up
        if up is not None and up.transport is not None:
            up.transport.write(data)
        else:
            self.pending.append(data)
            self.pending_size += len(data)
            if self.pending_size > HIGH_WATER:
                self.pause_reading(4)

    # -- requests ------------------------------------------------------------------------

    def _process(self) -> None:
        buf = self.buf
        while buf and not self.busy:
            hs: list[tuple[str, str, str]] = []
            r = parse_request(buf, hs)
            if not r:
                if r is None:
                    break
                return self._handoff(buf)
            end, method, target, http10, h = r
            if http10:
                return self._handoff(buf)  # HTTP/1.0: aiohttp
            if not target.startswith("/") or not method:
                return self._handoff(buf)  # absolute-form, asterisk-form
            if target.startswith(ADMIN_PREFIX) and (len(target) == 10 or target[10] in "/?"):
                return self._handoff(buf)
            if "transfer-encoding" in h or "expect" in h or "upgrade" in h:
                return self._handoff(buf)
            cl = h.get("content-length")
            if cl is not None and not cl.isdigit():
                return self._handoff(buf)
            blen = int(cl) if cl else 0
            conn = h.get("connection")
            conn_tokens = _tokens(conn) if conn is not None else None
            if conn_tokens is not None:  # "Connection" may come more than once
                for _, value, k in hs:
                    if k == "connection":
                        conn_tokens |= _tokens(value)
            self.keep = conn_tokens is None or "close" not in conn_tokens
            buf = buf[end + 4 :]
            body = b""
            if blen:
                body = buf[:blen]
                buf = buf[blen:]
                self.body_left = blen - len(body)
            self.buf = buf
            self._serve(method, target, h, hs, conn_tokens, body)
            buf = self.buf
        self.buf = buf
        if self.paused & 1 and not self.busy:
            self.resume_reading(1)

    def _serve(self, method, target, h, hs, conn_tokens, body: bytes) -> None:
        sc = self.sc
        self.busy = True
        self.method = method
        self.head_only = method == "HEAD"
        self.sent_head = False
        self.hpend = b""
        self.rechunk = False
        self.discarding = False
        self.retried = False
        self.pending = []
        self.pending_size = 0
        descs = sc._descriptors(self.peer, h, method, lambda: path_of_uri(target))
        fwd = self._forward_head(method, target, hs, conn_tokens)
        lim = sc.limiter
        if lim.is_sync:
            self._decided(lim.check_nowait(CheckRequest.simple(lim.rules.domain, descs)), fwd, body)
        else:
            self._loop().create_task(self._decide_async(descs, fwd, body))

    async def _decide_async(self, descs, fwd, body) -> None:
        lim = self.sc.limiter
        try:
            result = await lim.check(CheckRequest.simple(lim.rules.domain, descs))
        except Exception:  # never leave the connection hanging
            log.exception("decision failed")
            self.keep = False
            self._reply(Reply.problem(500, "Internal Server Error", "the sidecar failed to decide; see its log"))
            return self._done()
        self._decided(result, fwd, body)

    def _decided(self, result, fwd: bytes, body: bytes) -> None:
        if self.closed:
            return
        rh = rate_headers(result)
        self.rh = rh
        if result.code == OVER_LIMIT:
            self.sc.front.request("proxy", "over_limit")
            self.pending = []
            self.pending_size = 0
            if self.body_left:
                self.discarding = True
                self.keep = False  # do not wait for the rest of a body nobody wants
            self._reply(Reply(429, rh, problem_body(result, 429)))
            return self._done()
        # body bytes that came while an asynchronous decision was pending follow `body`
        self.pending[:0] = [fwd, body] if body else [fwd]
        self.pending_size += len(fwd) + len(body)
        self.replayable = self.body_left == 0 and self.method in IDEMPOTENT
        if result.delay > 0:
            self._loop().call_later(min(result.delay, MAX_DELAY), self._go)
        else:
            self._go()

    def _go(self) -> None:
        if self.closed:
            return
        up = self.pool.take()
        if up is not None:
            return self._attach(up)
        self._loop().create_task(self._connect())

    async def _connect(self) -> None:
        try:
            up = await self.pool.connect()
        except UpstreamError as exc:
            return self.up_failed(exc, False)
        if self.closed:
            self.pool.release(up)
            return
        self._attach(up)

    def _attach(self, up: UpstreamConn) -> None:
        self.up = up
        data = b"".join(self.pending) if len(self.pending) > 1 else self.pending[0]
        self.pending = []
        self.pending_size = 0
        self.sent = data if self.replayable else b""
        if self.write_paused and up.transport is not None:
            up.reading_paused = True
            up.transport.pause_reading()
        up.start(self, data, self.head_only)
        self.resume_reading(4)

    def _forward_head(self, method: str, target: str, hs, conn_tokens) -> bytes:
        pool = self.pool
        out = [f"{method} {pool.base}{target} HTTP/1.1\r\n"]
        xff: list[str] | None = None
        via: list[str] | None = None
        host = False
        for name, value, k in hs:
            if k in _EXTRA_HOP or (conn_tokens is not None and k in conn_tokens):
                continue
            if k == "x-forwarded-for":
                if xff is None:
                    xff = [value]
                    out.append(None)  # type: ignore[arg-type]  # placeholder, first occurrence
                    xff_at = len(out) - 1
                else:
                    xff.append(value)
                continue
            if k == "via":
                if via is None:
                    via = [value]
                    out.append(None)  # type: ignore[arg-type]
                    via_at = len(out) - 1
                else:
                    via.append(value)
                continue
            if k == "host":
                host = True
            out.append(f"{name}: {value}\r\n")
        if not host:
            out.insert(1, f"Host: {pool.hostport}\r\n")
            if xff is not None:
                xff_at += 1
            if via is not None:
                via_at += 1
        peer = self.peer
        if xff is None:
            out.append(f"X-Forwarded-For: {peer}\r\n")
        else:
            out[xff_at] = f"X-Forwarded-For: {', '.join(xff)}, {peer}\r\n"
        if via is None:
            out.append("Via: 1.1 netlimit\r\n")
        else:
            out[via_at] = f"Via: {', '.join(via)}, 1.1 netlimit\r\n"
        out.append("\r\n")
        return "".join(out).encode("latin-1")

    # -- replies from the upstream ---------------------------------------------------------

    def up_head(self, code: int, reason: str, hs, conn_tokens, mode: int) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        rh = self.rh
        rl = _lower_keys(rh) if rh else ()
        out = [f"HTTP/1.1 {code} {reason}\r\n"]
        for name, value, k in hs:
            if k in HOP_BY_HOP or k in rl or (conn_tokens is not None and k in conn_tokens):
                continue
            out.append(f"{name}: {value}\r\n")
        for k, v in rh.items():
            out.append(f"{k}: {v}\r\n")
        if mode == _CHUNKED or mode == _CLOSE:
            out.append("Transfer-Encoding: chunked\r\n")
            self.rechunk = mode == _CLOSE
        if self.body_left:
            self.keep = False  # the upstream answered before the whole body came
        if not self.keep:
            out.append("Connection: close\r\n")
        out.append("\r\n")
        self.sent_head = True
        self.hpend = "".join(out).encode("latin-1")  # written with the first body bytes

    def up_body(self, data: bytes) -> None:
        t = self.transport
        if t is not None and not self.head_only:
            h = self.hpend
            if h:
                self.hpend = b""
                t.write(h + data)  # one segment, one wake-up of the client, for small responses
            else:
                t.write(data)

    def up_body_rechunk(self, data: bytes) -> None:
        self.up_body(b"%x\r\n%b\r\n" % (len(data), data))

    def flush_head(self) -> None:
        h = self.hpend
        if h:
            self.hpend = b""
            t = self.transport
            if t is not None:
                t.write(h)

    def up_body_close_end(self) -> None:
        """The upstream closed the connection: the end of a close-delimited body."""
        self.up = None
        if self.head_only:
            self.flush_head()
        else:
            self.up_body(b"0\r\n\r\n")
        self.sc.front.request("proxy", "ok")
        self._done()

    def up_done(self) -> None:
        self.up = None
        self.flush_head()
        self.sc.front.request("proxy", "ok")
        self._done()

    def up_lost(self, up: UpstreamConn, head_done: bool, got: bool) -> None:
        """The upstream connection closed before the response was complete."""
        self.up = None
        if not got and up.used > 1 and self.sent and not self.retried and not self.closed:
            # a pooled connection the upstream had closed meanwhile: once more, on a new one
            self.retried = True
            self.pending = [self.sent]
            self.pending_size = len(self.sent)
            self._loop().create_task(self._connect())
            return
        self.up_failed(
            UpstreamError(
                502,
                "the upstream application closed the connection before answering"
                if not head_done
                else "the upstream application broke off its response",
            ),
            head_done,
        )

    def up_failed(self, exc: UpstreamError, head_done: bool) -> None:
        self.up = None
        self.sc.front.request("proxy", "upstream_error")
        if head_done or self.sent_head:
            # the response cannot be completed: the client must see it broken
            # (closed, not reset: the client sees the framing cut short)
            log.warning("upstream %s:%s: %s", self.pool.host, self.pool.port, exc.detail)
            self.keep = False
            self.busy = False
            if self.transport is not None:
                self.transport.close()
            return
        if self.body_left:
            self.discarding = True
            self.keep = False
        self._reply(
            Reply.problem(exc.status, "Bad Gateway" if exc.status == 502 else "Gateway Timeout", exc.detail),
            extra=self.rh,
        )
        self._done()

    # -- own answers -------------------------------------------------------------------------

    def _reply(self, reply: Reply, extra: dict[str, str] | None = None) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        parts = [f"HTTP/1.1 {reply.status} {_REASON.get(reply.status, 'Unknown')}\r\n"]
        for k, v in (extra or reply.headers).items():
            parts.append(f"{k}: {v}\r\n")
        body = reply.body.encode()
        parts.append(f"Content-Type: {PROBLEM_TYPE}; charset=utf-8\r\nContent-Length: {len(body)}\r\n")
        if not self.keep:
            parts.append("Connection: close\r\n")
        parts.append("Server: netlimit\r\nDate: ")
        tail = b"\r\n\r\n" if self.head_only else b"\r\n\r\n" + body
        t.write("".join(parts).encode("latin-1") + http_date_bytes() + tail)

    def _done(self) -> None:
        """The response is complete: the next request, or close."""
        self.busy = False
        self.sent = b""
        self.rh = {}
        t = self.transport
        if t is None or self.closed:
            return
        if not self.keep:
            self.buf = b""
            if self.body_left or self.discarding:
                return self._linger(t)
            t.close()
            return
        self.resume_reading(6)
        if self.buf:
            self._process()
        elif self.paused & 1:
            self.resume_reading(1)

    def _linger(self, t: asyncio.Transport) -> None:
        """Close without destroying the response: the client may still be sending
        a body nobody reads, and closing with unread input resets the connection
        (the client could lose the response).  Half-close, drop what comes for a
        while, then close (nginx's lingering_close)."""
        self.lingering = True
        self.busy = True
        self.body_left = 0
        self.paused = 0
        try:
            t.resume_reading()
            t.write_eof()
        except (OSError, RuntimeError, NotImplementedError):
            t.close()
            return
        self._loop().call_later(LINGER, t.close)


_REASON = {502: "Bad Gateway", 504: "Gateway Timeout", 429: "Too Many Requests", 500: "Internal Server Error"}
