"""A lean asyncio Redis client for the RedisStore hot path (RESP2, one socket).

Why not redis-py's asyncio client: per decision it spends most of its time in
Python around the socket (connection pool get/release, retry wrapper, argument
encoding, stream reader, observability hooks) and makes one ``send`` syscall
per command.  This client keeps only what the store needs:

* one TCP or unix-socket connection per client, an :class:`asyncio.Protocol`
  whose replies are parsed by ``hiredis.Reader`` and matched FIFO to futures;
* commands are encoded straight to bytes (or sent already encoded,
  :meth:`RespClient.send_packed`), and commands issued by concurrent callers in one loop
  iteration go out in one write (auto-pipelining).  Every command is still one
  request and one reply: pipelining shares syscalls, it adds no command;
* every command has a deadline (``timeout``); one timer per connection, armed
  for the oldest outstanding command, expires them (no timer per call).  A reply
  that arrives after its deadline is read and dropped, so the connection stays
  in step; a connection that has not answered for ``dead_after`` seconds is
  dropped;
* a lost connection fails every outstanding command with
  :class:`RespConnectionError`; the next command reconnects.  Failed connects
  back off exponentially (up to ``max_backoff``): a command that would have to
  wait past its deadline for the next attempt fails at once, one that would not
  waits for it;
* ``AUTH`` / ``SELECT`` from the URL (``redis://[user:password@]host:port/db``,
  ``unix://[user:password@]/path?db=N``) on every new connection, before any
  queued command; TLS for ``rediss://`` (an :class:`ssl.SSLContext` in the
  :class:`Address`, the ``ssl_*`` options of netlimit/config/redis_url.py).

Errors: :class:`ReplyError` (a ``-ERR ...`` reply; :class:`NoScriptError` for
``NOSCRIPT``), :class:`RespConnectionError` (also a :class:`ConnectionError`),
:class:`RespTimeoutError` (also a :class:`TimeoutError`),
:class:`RespProtocolError` (the peer sent something that is not RESP).
"""

from __future__ import annotations

import asyncio
import os
import ssl
import threading
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, cast

import hiredis

from ...config.redis_url import RedisURL, parse_redis_url
from ...errors import NetlimitError

__all__ = [
    "Address",
    "NoScriptError",
    "ReplyError",
    "RespClient",
    "RespConnectionError",
    "RespError",
    "RespProtocolError",
    "RespTimeoutError",
    "bulk",
    "pack",
    "parse_url",
    "tls_context",
    "url_addresses",
]


class RespError(NetlimitError):
    """Base of this client's errors."""


class ReplyError(RespError):
    """Redis answered with an error reply (``-ERR ...``, ``-WRONGTYPE ...``)."""


class NoScriptError(ReplyError):
    """``NOSCRIPT``: the server does not hold the script (SCRIPT FLUSH, restart)."""


class RespConnectionError(RespError, ConnectionError):
    """No connection, or it was lost before the reply came."""


class RespTimeoutError(RespError, TimeoutError):
    """No reply within the command's timeout (or the connect timed out)."""


class RespProtocolError(RespConnectionError):
    """The peer sent bytes that are not RESP (the connection is dropped)."""


def _reply_error(msg: str) -> ReplyError:
    """hiredis' ``replyError`` factory: error replies become exception instances."""
    if msg.startswith("NOSCRIPT"):
        return NoScriptError(msg)
    return ReplyError(msg)


# --------------------------------------------------------------------------- addresses


@dataclass(frozen=True)
class Address:
    host: str = "127.0.0.1"
    port: int = 6379
    path: str | None = None  # unix socket
    username: str | None = None
    password: str | None = None
    db: int = 0
    #: TLS: the context connections are wrapped in (None: plain TCP)
    ssl: ssl.SSLContext | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        return f"unix:{self.path}" if self.path else f"{self.host}:{self.port}"

    def at(self, host: str, port: int) -> Address:
        """The same credentials and TLS at another host (a cluster node, a new primary)."""
        return replace(self, host=host, port=port, path=None)


def tls_context(u: RedisURL) -> ssl.SSLContext:
    """The client TLS context of a ``rediss...`` URL's options (redis_url.py):
    certificates checked against ``ssl_ca_certs`` (else the system's CAs) and the
    host name checked unless the URL says otherwise."""
    opts = u.options
    reqs = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}[
        opts.get("ssl_cert_reqs", "required").lower()
    ]
    ctx = ssl.create_default_context(cafile=opts.get("ssl_ca_certs"))
    ctx.check_hostname = reqs != ssl.CERT_NONE and u.check_hostname
    ctx.verify_mode = reqs
    if "ssl_certfile" in opts:
        ctx.load_cert_chain(opts["ssl_certfile"], opts.get("ssl_keyfile"))
    return ctx


def url_addresses(u: RedisURL) -> list[Address]:
    """One :class:`Address` per host of a parsed URL (its credentials, db and TLS)."""
    ctx = tls_context(u) if u.tls else None
    if u.kind == "unix":
        return [Address(path=u.path, username=u.username, password=u.password, db=u.db)]
    return [Address(host=h, port=p, username=u.username, password=u.password, db=u.db, ssl=ctx) for h, p in u.hosts]


def parse_url(url: str) -> Address | None:
    """The address of a ``redis://``, ``rediss://`` or ``unix://`` URL this client
    handles, else None (a cluster or sentinel URL, query options it does not
    know: the caller falls back to redis-py).  ValueError for a URL that is
    wrong whoever reads it."""
    u = parse_redis_url(url)
    if u.kind not in ("single", "unix") or u.other:
        return None
    return url_addresses(u)[0]


# --------------------------------------------------------------------------- encoding


def bulk(a: Any) -> bytes:
    """One RESP bulk string (as :func:`pack` encodes each argument)."""
    t = type(a)
    if t is str:
        a = a.encode("utf-8", "surrogatepass")
    elif t is int:
        a = b"%d" % a
    elif t is float:
        a = repr(a).encode()
    elif isinstance(a, (bytes, bytearray, memoryview)):
        a = bytes(a)
    else:
        raise TypeError(f"cannot send {type(a).__name__} to redis: {a!r}")
    return b"$%d\r\n%b\r\n" % (len(a), a)


_get_ident = threading.get_ident
_FORK_EPOCH = [0]  # + 1 in a forked child: a client checks its loop again there
os.register_at_fork(after_in_child=lambda: _FORK_EPOCH.__setitem__(0, _FORK_EPOCH[0] + 1))

_NAMES: dict[Any, bytes] = {}  # encoded command names (a small set)


def pack(args: tuple[Any, ...]) -> bytes:
    """RESP array of bulk strings: ``str`` as UTF-8 (surrogates kept), ``bytes``
    as is, ``int`` and ``float`` as Redis reads them."""
    name = args[0]
    e = _NAMES.get(name)
    if e is None:
        e = bulk(name)
        if len(_NAMES) < 256:
            _NAMES[name] = e
    out = [b"", e]
    app = out.append
    n = len(args)
    for a in args[1:]:
        t = type(a)
        if t is str:
            a = a.encode("utf-8", "surrogatepass")
            app(b"$%d\r\n%b\r\n" % (len(a), a))
        elif t is bytes:
            app(b"$%d\r\n%b\r\n" % (len(a), a))
        else:
            app(bulk(a))
    out[0] = b"*%d\r\n" % n
    return b"".join(out)


# --------------------------------------------------------------------------- the connection


class _Conn(asyncio.Protocol):
    """One connection: its replies, its outstanding commands (FIFO), its write buffer."""

    __slots__ = (
        "client",
        "transport",
        "reader",
        "pending",
        "n_expired",
        "wbuf",
        "flushing",
        "replies",
        "lost",
        "error",
    )

    def __init__(self, client: RespClient) -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None
        self.reader = hiredis.Reader(replyError=_reply_error)
        # (future, deadline) in the order the commands were written; the first
        # n_expired entries are past their deadline (their futures are done)
        self.pending: deque[tuple[asyncio.Future, float]] = deque()
        self.n_expired = 0
        self.wbuf: list[bytes] = []
        self.flushing = False
        self.replies = 0
        self.lost = False
        self.error: BaseException | None = None  # why the connection is being dropped

    # asyncio callbacks ----------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream connection's transport

    def data_received(self, data: bytes) -> None:
        reader = self.reader
        reader.feed(data)
        pending = self.pending
        while not self.lost:
            try:
                reply = reader.gets()
            except hiredis.ProtocolError as e:
                self.abort(RespProtocolError(f"redis at {self.client.address}: not a RESP reply ({e})"))
                return
            if reply is False:
                return
            if not pending:
                self.abort(
                    RespProtocolError(f"redis at {self.client.address}: a reply nobody asked for: {reply!r:.100}")
                )
                return
            fut, _ = pending.popleft()
            self.replies += 1
            if self.n_expired:
                self.n_expired -= 1
                continue
            if fut.done():  # the caller was cancelled
                continue
            if isinstance(reply, ReplyError):
                fut.set_exception(reply)
            else:
                fut.set_result(reply)

    def eof_received(self) -> bool:
        return False  # close

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        err = self.error
        if err is None:
            addr = self.client.address
            err = RespConnectionError(
                f"connection to redis at {addr} lost: {exc!r}"
                if exc
                else f"connection to redis at {addr} closed by the server"
            )
            if exc is not None:
                err.__cause__ = exc
        self.fail_all(err)
        self.client._lost(self, err)

    # ours -------------------------------------------------------------------------
    def flush(self) -> None:
        self.flushing = False
        buf = self.wbuf
        if buf and not self.lost:
            data = buf[0] if len(buf) == 1 else b"".join(buf)
            buf.clear()
            self.client.writes += 1
            try:
                # flush() is scheduled only on a connected _Conn: its transport is set (no check per write)
                self.transport.write(data)  # type: ignore[union-attr]
            except Exception as e:  # a transport (asyncio, uvloop, ssl) may raise anything: the connection is aborted
                self.abort(RespConnectionError(f"cannot write to redis at {self.client.address}: {e!r}"))

    def fail_all(self, err: BaseException) -> None:
        pending = self.pending
        self.pending = deque()
        self.n_expired = 0
        self.wbuf.clear()
        for fut, _ in pending:
            if not fut.done():
                fut.set_exception(_copy(err))

    def abort(self, err: BaseException) -> None:
        """Drop the connection: every outstanding command fails with ``err``."""
        if self.lost:
            return
        self.lost = True
        self.error = err
        self.fail_all(err)
        if self.transport is not None:
            try:
                self.transport.abort()  # connection_lost follows (and finds nothing pending)
            except Exception:
                pass
        self.client._lost(self, err)


def _copy(err: BaseException) -> BaseException:
    """A fresh exception per future (tracebacks would otherwise pile up on one object)."""
    new = type(err)(*err.args)
    new.__cause__ = err.__cause__
    return new


# --------------------------------------------------------------------------- the client


class RespClient:
    """See the module docstring.  ``timeout`` (seconds) bounds every command,
    connect included; ``connect_timeout`` defaults to it."""

    def __init__(
        self,
        url_or_address: str | Address,
        *,
        timeout: float = 0.05,
        connect_timeout: float | None = None,
        max_backoff: float = 1.0,
        dead_after: float | None = None,
    ) -> None:
        if isinstance(url_or_address, Address):
            addr = url_or_address
        else:
            parsed = parse_url(url_or_address)
            if parsed is None:
                raise ValueError(
                    f"RespClient cannot handle {url_or_address!r} (a cluster or sentinel URL, or unknown options)"
                )
            addr = parsed
        if timeout <= 0:
            raise ValueError("timeout must be > 0")
        self.address = addr
        self.timeout = float(timeout)
        self.connect_timeout = float(connect_timeout if connect_timeout is not None else timeout)
        self.max_backoff = float(max_backoff)
        # a connection whose oldest command has waited this long is given up on
        self.dead_after = float(dead_after if dead_after is not None else max(2.0, 10 * timeout))
        self._handshake: list[tuple[Any, ...]] = []
        if addr.password is not None:
            self._handshake.append(
                (b"AUTH", addr.username, addr.password) if addr.username else (b"AUTH", addr.password)
            )
        if addr.db:
            self._handshake.append((b"SELECT", addr.db))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._epoch = -1  # _FORK_EPOCH and thread when _loop was last checked
        self._tid = -1
        self._conn: _Conn | None = None  # connected (handshake done) and not lost
        self._connecting: asyncio.Task | None = None
        # commands waiting for a connection: (future, deadline, data)
        self._waiting: list[tuple[asyncio.Future, float, bytes]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._fails = 0  # connect attempts failed in a row
        self._next_attempt = 0.0  # loop time before which no connect is tried
        self._last_error: BaseException | None = None
        # counters (the benchmark and tests read them)
        self.commands_sent = 0  # commands handed to a connection (one reply each)
        self.writes = 0  # socket writes those took (pipelining: fewer)
        self.connects = 0

    def __repr__(self) -> str:
        return f"<RespClient {self.address} {'connected' if self._conn else 'disconnected'}>"

    @property
    def connected(self) -> bool:
        return self._conn is not None

    @property
    def reachable(self) -> bool | None:
        """True while connected; False after a failed connect or a lost connection;
        None before the first attempt."""
        if self._conn is not None:
            return True
        if self.connects == 0 and self._fails == 0:
            return None
        return False

    @property
    def last_error(self) -> str | None:
        """The last connect failure (bounded text), for operators."""
        return None if self._last_error is None else str(self._last_error)[:200]

    # -- commands ------------------------------------------------------------------
    def execute_command(self, *args: Any, timeout: float | None = None) -> asyncio.Future[Any]:
        """Send one command; returns a future of its reply (hiredis types: bytes,
        int, list, None; error replies raise :class:`ReplyError`)."""
        return self.send_packed(pack(args), timeout)

    def send_packed(self, data: bytes, timeout: float | None = None) -> asyncio.Future[Any]:
        """Send one already-encoded command (exactly one: its reply resolves the future)."""
        loop = self._loop
        # asyncio.get_running_loop() costs a getpid() system call per command on
        # Python 3.11; the loop this client is bound to, still running in this
        # thread and process, is the running one
        if loop is None or self._epoch != _FORK_EPOCH[0] or _get_ident() != self._tid or not loop.is_running():
            loop = asyncio.get_running_loop()
            if loop is not self._loop:
                self._bind(loop)
            self._epoch, self._tid = _FORK_EPOCH[0], _get_ident()
        fut = loop.create_future()
        deadline = loop.time() + (self.timeout if timeout is None else timeout)
        conn = self._conn
        if conn is not None:
            pending = conn.pending
            idle = not pending
            pending.append((fut, deadline))
            self.commands_sent += 1
            if idle and not conn.flushing:
                # nothing outstanding: write now (lowest latency for a lone caller)
                self.writes += 1
                try:
                    # self._conn is set only once connected: its transport exists (no check per command)
                    conn.transport.write(data)  # type: ignore[union-attr]
                # a transport (asyncio, uvloop, ssl) may raise anything: the connection is aborted
                except Exception as e:
                    conn.abort(RespConnectionError(f"cannot write to redis at {self.address}: {e!r}"))
                    return fut
            else:
                # others are in flight: coalesce with what this loop iteration sends
                conn.wbuf.append(data)
                if not conn.flushing:
                    conn.flushing = True
                    loop.call_soon(conn.flush)
            if self._timer is None or self._timer_at > deadline:
                self._arm(deadline)
            return fut
        self._enqueue(loop, fut, deadline, data)
        return fut

    async def script_load(self, source: str, *, timeout: float | None = None) -> str:
        sha = await self.execute_command(b"SCRIPT", b"LOAD", source, timeout=timeout)
        return sha.decode()

    async def ping(self, *, timeout: float | None = None) -> bool:
        return await self.execute_command(b"PING", timeout=timeout) == b"PONG"

    async def aclose(self) -> None:
        """Drop the connection (outstanding commands fail); a later command reconnects."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # the connection belonged to another (closed) loop
            self._bind(loop)
            return
        err = RespConnectionError("redis client closed")
        if self._connecting is not None:
            self._connecting.cancel()
            self._connecting = None
        self._fail_waiting(err)
        conn = self._conn
        self._conn = None
        if conn is not None:
            conn.abort(err)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    close = aclose

    # -- connecting ------------------------------------------------------------------
    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """First use, or use from another event loop (a new asyncio.run): forget the
        old loop's connection and timers."""
        if self._conn is not None and self._conn.transport is not None:
            try:
                self._conn.transport.abort()
            except Exception:  # the old loop's transport may raise anything (its loop closed): it is dropped anyway
                pass
        self._loop = loop
        self._conn = None
        self._connecting = None
        self._waiting = []
        self._timer = None
        self._fails = 0
        self._next_attempt = 0.0

    def _enqueue(self, loop: asyncio.AbstractEventLoop, fut: asyncio.Future, deadline: float, data: bytes) -> None:
        """Not connected: queue the command for the connection being made (starting
        one if needed), or fail it now when the next attempt (backing off after
        failed connects) would come after its deadline."""
        if self._next_attempt > deadline:
            wait = self._next_attempt - loop.time()
            err = RespConnectionError(
                f"redis at {self.address} unreachable ({self._fails} failed connects in a row, last: "
                f"{self._last_error}); next attempt in {wait * 1000:.0f} ms"
            )
            err.__cause__ = self._last_error
            fut.set_exception(err)
            return
        if self._connecting is None:
            self._connecting = loop.create_task(self._connect())
        self._waiting.append((fut, deadline, data))
        if self._timer is None or self._timer_at > deadline:
            self._arm(deadline)

    async def _connect(self) -> None:
        loop = self._loop
        assert loop is not None
        delay = self._next_attempt - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        conn = _Conn(self)
        addr = self.address
        try:
            try:
                async with asyncio.timeout(self.connect_timeout):
                    if addr.path:
                        await loop.create_unix_connection(lambda: conn, addr.path)
                    elif addr.ssl is not None:
                        await loop.create_connection(
                            lambda: conn, addr.host, addr.port, ssl=addr.ssl, server_hostname=addr.host
                        )
                    else:
                        await loop.create_connection(lambda: conn, addr.host, addr.port)
                    if self._handshake:
                        await self._do_handshake(loop, conn)
            except TimeoutError as e:
                raise RespTimeoutError(
                    f"connect to redis at {addr} timed out after {self.connect_timeout * 1000:g} ms"
                ) from e
            except ReplyError as e:
                raise RespConnectionError(f"redis at {addr} refused the handshake: {e}") from e
            except OSError as e:
                if isinstance(e, RespError):
                    raise
                raise RespConnectionError(f"cannot connect to redis at {addr}: {e}") from e
        except RespError as err:
            self._connecting = None
            if conn.transport is not None:
                conn.abort(err)
            self._connect_failed(loop, err)
            return
        except asyncio.CancelledError:
            if conn.transport is not None:
                conn.abort(RespConnectionError("redis client closed"))
            raise
        self._connecting = None
        self._conn = conn
        self.connects += 1
        # a connection that dies before answering anything counts as a failed attempt
        # (e.g. "max number of clients reached"): see _lost
        waiting = self._waiting
        self._waiting = []
        for fut, deadline, data in waiting:
            if not fut.done():
                conn.pending.append((fut, deadline))
                conn.wbuf.append(data)
                self.commands_sent += 1
        conn.flush()
        if conn.pending and self._timer is None:
            self._arm(conn.pending[0][1])

    async def _do_handshake(self, loop: asyncio.AbstractEventLoop, conn: _Conn) -> None:
        futs = []
        for cmd in self._handshake:
            fut = loop.create_future()
            conn.pending.append((fut, float("inf")))
            futs.append(fut)
            conn.wbuf.append(pack(cmd))
        conn.flush()
        try:
            for fut in futs:
                await fut
        finally:
            for fut in futs:  # retrieve every outcome (no "exception was never retrieved")
                if fut.done() and not fut.cancelled():
                    fut.exception()

    def _connect_failed(self, loop: asyncio.AbstractEventLoop, err: BaseException) -> None:
        self._fails += 1
        self._last_error = err
        backoff = min(self.max_backoff, 0.005 * 2 ** min(self._fails, 20))
        self._next_attempt = loop.time() + backoff
        self._fail_waiting(err)

    def _fail_waiting(self, err: BaseException) -> None:
        waiting = self._waiting
        self._waiting = []
        for fut, _, _ in waiting:
            if not fut.done():
                fut.set_exception(_copy(err))

    def _lost(self, conn: _Conn, err: BaseException) -> None:
        if conn is not self._conn:
            return
        self._conn = None
        if conn.replies == 0 and self._loop is not None:
            self._connect_failed(self._loop, err)  # back off: it never worked
        else:
            self._fails = 0
            self._next_attempt = 0.0
            self._last_error = err

    # -- deadlines -----------------------------------------------------------------------
    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        # deadlines are armed by commands, which bind the client to their loop first (_bind)
        self._timer = self._loop.call_at(when, self._sweep)  # type: ignore[union-attr]

    def _sweep(self) -> None:
        """Expire every command past its deadline; re-arm for the next one."""
        self._timer = None
        loop = self._loop
        assert loop is not None
        now = loop.time()
        nxt = float("inf")
        conn = self._conn
        if conn is not None:
            pending = conn.pending
            i = conn.n_expired
            n = len(pending)
            if n and pending[0][1] + self.dead_after <= now:
                conn.abort(
                    RespTimeoutError(
                        f"redis at {self.address} has not answered for {now - pending[0][1] + self.timeout:.1f} s; "
                        "dropping the connection"
                    )
                )
            else:
                while i < n:
                    fut, deadline = pending[i]
                    if deadline > now:
                        nxt = deadline
                        break
                    if not fut.done():
                        fut.set_exception(
                            RespTimeoutError(f"no reply from redis at {self.address} within {self.timeout * 1000:g} ms")
                        )
                    i += 1
                conn.n_expired = i
                if i and nxt == float("inf"):
                    # everything outstanding expired: look again when the oldest turns dead
                    nxt = pending[0][1] + self.dead_after
        if self._waiting:
            for fut, deadline, _ in self._waiting:
                if fut.done():
                    continue
                if deadline <= now:
                    fut.set_exception(
                        RespTimeoutError(f"no connection to redis at {self.address} within {self.timeout * 1000:g} ms")
                    )
                elif deadline < nxt:
                    nxt = deadline
            self._waiting = [w for w in self._waiting if not w[0].done()]
        if nxt != float("inf"):
            self._arm(nxt)
