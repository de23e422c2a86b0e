"""One client connection (:class:`HttpConnection`): llhttp's callbacks fill a
:class:`~.head.Request`, the requests queue within the pipeline bound and are
answered in order by the listener's handler (the package's docstring lists
every bound)."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
import traceback
from collections import deque
from collections.abc import Awaitable
from typing import Any, Protocol

import httptools

from ...logevery import LogEvery
from .. import responses
from .body import Body
from .head import NAMES, XFF, Request, check_head, edge_tab, field_name, plain_names
from .limits import ClientError, Limits
from .state import ServerState

log = logging.getLogger("netlimit.sidecar")
_monotonic = time.monotonic

#: seconds an unwanted request body is still read (and dropped) after the answer,
#: so that closing does not reset the connection under the answer (lingering close)
LINGER = 2.0
_HEAD_END = b"\r\n\r\n"
_CR_LF = (b"\r", b"\n")
#: the tab byte as an int: ``9 in data`` is one memchr, while ``b"\t" in data`` first
#: tries the needle as an integer and formats (and drops) a TypeError -- 1.8k
#: instructions per test on CPython 3.11
_TAB = 9
_bad_log = LogEvery(10.0)
_METHODS: dict[bytes, str] = {}  # llhttp's method names -> text


class Handler(Protocol):
    @property
    def wanted(self) -> frozenset[str] | None:
        """The header names the handler reads (lower case), or None for every field
        (a proxy forwards them all); the others are not even decoded.  Asked when
        the connection starts and after each reload (ServerState.plans)."""
        ...

    def handle(self, conn: HttpConnection, req: Request) -> bytes | Awaitable[bytes | None]:
        """The whole answer now, or a coroutine that writes or returns it."""
        ...

    def bad_request(self) -> None:
        """Count a request refused before it reached the handler."""
        ...


class HttpConnection(asyncio.Protocol):
    """One client connection: parse, queue, answer in order, within the limits."""

    def __init__(self, state: ServerState, handler: Handler, limits: Limits):
        self.state = state
        self.handler = handler
        self.limits = limits
        self.wanted = handler.wanted
        self._plans = state.plans  # the reloads `wanted` is as of (ServerState.plans)
        self._plain = plain_names(self.wanted)  # on_header's one-lookup fields (head.plain_names)
        self.parser = httptools.HttpRequestParser(self)
        self.transport: Any = None
        self.peer = ""
        self.queue: deque[Request] = deque()
        self.cur: Request | None = None  # the request being parsed
        self.task: asyncio.Task | None = None  # the answer being produced, if it had to wait
        self.paused: set[str] = set()
        self.reading = True  # whether the transport is reading (pause_reading not in force)
        self.pending: bytes | None = None  # read but not parsed yet: waits for room (see _feed)
        self.write_paused = False
        self._drained: asyncio.Future | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.memo: Any = None  # the handler's own, per connection (endpoints.py: the decision's descriptor)
        self.head_since = 0.0  # when the request head being parsed began (sweep: header_timeout)
        self.head_bytes = 0
        self.in_head = False
        self.lingering = False  # the answer is out; what still arrives is dropped
        self.stopped = False  # no more requests are parsed (a parse error, an upgrade, a last answer)
        self.closing = False
        self.last = _monotonic()  # the last answer (or the connection's start): idle since
        self.now = self.last  # the clock at the read being parsed (data_received, _feed_pending, _wait)
        self.out_total = 0  # bytes handed to the transport (sweep: send_timeout)
        self.out_mark = 0  # out_total when write() last flushed the batch early (see write)
        self.sent_mark = 0
        self.send_since = self.last
        self._piece: bytes = b""  # what the parser is being fed (the request line check)
        self._line: bytearray | None = None  # a request line arriving over several pieces
        self._crlf_tail = False  # the last piece parsed ended with CR or LF in the middle of a head
        self._fresh = False  # the piece being parsed began between two messages
        self._at0 = False  # the head being parsed began at the start of its piece
        self._v11 = False  # on_header saw the head's request line end in HTTP/1.1 (one piece)

    # -- state -------------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        return self.cur is None and not self.queue

    def _loop(self) -> asyncio.AbstractEventLoop:
        loop = self.loop
        if loop is None:
            loop = self.loop = asyncio.get_running_loop()
        return loop

    def pause(self, why: str) -> None:
        self.paused.add(why)
        if self.reading and self.transport is not None:
            self.reading = False
            self.transport.pause_reading()

    def resume(self, why: str) -> None:
        if why not in self.paused:
            return
        self.paused.discard(why)
        if self.paused or self.closing or self.transport is None:
            return
        if self.pending is not None:  # parse what waited first (not from inside a callback)
            self._loop().call_soon(self._feed_pending)
            return
        self._read_again()

    def _read_again(self) -> None:
        if not self.reading and not self.closing and not self.paused:
            self.reading = True
            self.transport.resume_reading()
            if self.in_head:  # the time we were not reading is not the client's
                self.head_since = self.now = _monotonic()

    def _feed_pending(self) -> None:
        data, self.pending = self.pending, None
        if data is None or self.closing or self.stopped or self.lingering:
            return
        if self.paused:  # paused again meanwhile: keep waiting
            self.pending = data
            return
        self.now = _monotonic()
        self._feed(data)
        if not self.paused:
            self._read_again()

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = peer[0] if peer else ""
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        transport.set_write_buffer_limits(self.limits.write_high, self.limits.write_low)
        if not self.state.add(self):
            held = _bad_log.due("refused")
            if held >= 0:
                more = f" ({held} more since the last report)" if held else ""
                n = len(self.state.conns)
                log.warning(
                    "connection from %s refused: %d connections, none idle%s",
                    self.peer,
                    n,
                    more,
                    extra={"client": self.peer},
                )
            self.closing = True
            transport.abort()
            return

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.pending = None
        self.state.conns.pop(self, None)
        if self.task is not None:
            self.task.cancel()
        gone = ConnectionResetError("the client closed the connection")
        for req in self.queue:
            if req.body is not None:
                req.body.fail(gone)
        if self.cur is not None and self.cur.body is not None:
            self.cur.body.fail(gone)
        if self._drained is not None and not self._drained.done():
            self._drained.set_exception(gone)

    def pause_writing(self) -> None:
        self.write_paused = True
        self.pause("write")

    def resume_writing(self) -> None:
        self.write_paused = False
        self.resume("write")
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def eof_received(self) -> bool:
        # the client finished sending: answer what it asked, then close (a half-close
        # with requests in flight is how some clients end).  Answers held for the end
        # of the loop iteration go to the transport first: returning False closes it,
        # and a closing transport takes no more writes (uvloop delivers the end of a
        # read and its EOF in one iteration: a JSON answer was lost that way)
        self.state.flush_out()
        if self.cur is not None and self.cur.body is not None:
            self.cur.body.fail(ClientError(400, "the request body ended early"))
        elif self.in_head:  # a head cut short: nothing to answer (nginx closes too)
            self.cur = None
            self.in_head = False
        if self.idle and self.task is None:
            return False
        self.stopped = True
        return True

    def data_received(self, data: bytes, piece: bool = False) -> None:
        """A read (or, from :meth:`_feed`, a piece of one that fits the queue)."""
        if not piece:
            self.now = _monotonic()
            if self.stopped or self.lingering:
                return
            if self.pending is not None:  # a read delivered while paused: keep the order
                self.pending += data
                return
            room = self.limits.max_pipeline - len(self.queue)
            if (
                self.paused or self._crlf_tail or (len(data) >> 2 > room and data.count(_HEAD_END) > room)
            ):  # more heads than there is room for (the usual read fits: parsed here at once; a
                # read of n bytes holds at most n/4 head ends, so a short one is not even searched)
                self._feed(data)
                return
        head = self.cur if self.in_head else None  # a head in progress before these bytes
        self._piece = data
        self._fresh = self.cur is None  # between messages: the next one may begin at the piece's start
        self._crlf_tail = False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # CONNECT or an Upgrade request: its head is queued (on_headers_complete);
            # what follows it is not HTTP for us
            self.stopped = True
            if self.queue:
                req = self.queue[-1]
                if req.error is None:
                    if req.method == "CONNECT":
                        req.error = ClientError(405, "CONNECT is not allowed: this is a reverse proxy")
                    else:
                        req.error = ClientError(501, "protocol upgrades (WebSocket) are not supported by the sidecar")
        except httptools.HttpParserCallbackError as exc:  # our own callback failed: not the client's fault
            self.refuse(self._failed(exc.__context__ or exc))
            return
        except httptools.HttpParserError as bad:
            self.refuse(self._parse_error(bad))
            return
        if self.in_head:
            self._head_goes_on(data, head)
            if self.stopped:
                return
        self._process()

    def _head_goes_on(self, data: bytes, head: Request | None) -> None:
        """A head still arriving at the end of a piece: its size so far, its request
        line kept for _check_line, a terminator that may straddle the next piece."""
        self._crlf_tail = data.endswith(_CR_LF)
        if head is not None and self.cur is head:  # one head spanning whole reads
            self.head_bytes += len(data)
        if self.head_bytes > self.limits.max_head:
            self.refuse(ClientError(431, f"the request head is larger than {self.limits.max_head} bytes"))
            return
        cur = self.cur
        if cur is not None and cur._size == 0:  # the request line may go on in the next read
            line = self._line
            if line is None:
                self._line = bytearray(data[-self.limits.max_head :])
            elif len(line) + len(data) > self.limits.max_head + 1024:
                self.refuse(ClientError(431, f"the request line is longer than {self.limits.max_head} bytes"))
            else:
                line += data

    def _feed(self, data: bytes) -> None:
        """Parse ``data`` in pieces that cannot complete more request heads than the
        queue has room for; when it is full (or reading is paused for another
        reason), the rest waits unparsed in ``pending`` until :meth:`resume`.

        In strict mode llhttp completes a head only at a CR LF CR LF, and the ends
        of two heads never overlap: a piece holding ``n`` of them (counting one
        that straddles the previous piece) completes at most ``n`` heads."""
        limit = self.limits.max_pipeline
        pos = 0
        end = len(data)
        while True:
            room = limit - len(self.queue)
            if room <= 0 or self.paused:
                self.pending = data[pos:]
                if room <= 0:
                    self.pause("pipeline")
                return
            if self._crlf_tail:  # the previous piece may have ended in the middle of one
                room -= 1
            i = pos
            cur = self.cur
            if cur is not None and not self.in_head and cur.body is not None and cur.body.length is not None:
                i += cur.body.length - cur.body.received  # the rest of a body ends no head
            cut = end
            if room <= 0:
                cut = pos + 1
            else:
                for _ in range(room):  # just after the room-th end, if one more follows
                    j = data.find(_HEAD_END, i)
                    if j < 0:
                        break
                    i = j + 4
                else:
                    if data.find(_HEAD_END, i) >= 0:
                        cut = i
            if pos == 0 and cut == end:
                self.data_received(data, True)
                return
            self.data_received(data[pos:cut], True)
            pos = cut
            if pos >= end or self.stopped or self.closing or self.lingering:
                return

    def _parse_error(self, exc: httptools.HttpParserError) -> ClientError:
        reason = _reason(exc)
        if "HTTP version" in reason:
            try:
                major = int(self.parser.get_http_version().split(".")[0])
            except ValueError:
                major = 0
            if major >= 2:  # as nginx: a version it cannot speak is 505, a malformed one 400
                return ClientError(505, "HTTP/1.1 and HTTP/1.0 only")
        return ClientError(400, f"malformed request: {reason}")

    # -- llhttp callbacks ----------------------------------------------------------------

    # No on_message_begin: httptools calls only the callbacks the protocol defines, and
    # the first piece of the target begins the request (one llhttp callback less per
    # request).  A method cut short by the end of a read is no head yet: the connection
    # stays idle (keepalive_timeout) until its target begins.

    def on_url(self, url: bytes) -> None:
        cur = self.cur
        if cur is None:  # the request begins
            cur = self.cur = Request()
            if self._plans != self.state.plans:  # a reload since: the actions may read other fields
                self._plans = self.state.plans
                wanted = self.handler.wanted
                if wanted is not self.wanted:
                    self.wanted = wanted
                    self._plain = plain_names(wanted)
            self.head_bytes = len(url)
            self.in_head = True
            self.head_since = self.now  # the read that brought it (one clock read per read)
            self._line = None
            self._at0, self._fresh = self._fresh, False
            cur._url = url
            return
        cur._url += url
        self.head_bytes += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        cur = self.cur
        assert cur is not None
        if not self.in_head:  # a trailer field of a chunked body: dropped, as nginx does (never a header)
            return
        if cur._size == 0:
            piece = self._piece
            at = piece.find(b" ") + len(cur._url) + 2
            proto = piece[at : at + 10] if self._line is None and self._at0 else b""
            if proto == b"HTTP/1.1\r\n":
                # the usual head began this piece, its protocol where it must be (after the
                # first space, the target and a space: no parser call); its version is the
                # bytes llhttp just accepted (get_http_version formats a string: 1.2 us)
                self._v11 = True
            elif proto.startswith(b"HTTP/"):
                self._v11 = False
            else:  # look (RTSP, ICE)
                self._check_line(cur)
        cur._size += 1
        self.head_bytes += len(name) + len(value) + 4
        plain = self._plain.get(name)
        if plain is not None:  # a field only collected (or not even that), seen before
            if plain and plain not in cur.fields:  # the first line wins (see Request.fields)
                cur.fields[plain] = value.decode("latin-1")
            return
        info = NAMES.get(name)
        if info is None:
            info = field_name(name)
        lname, special = info
        joined = 0
        if special is not None:
            bit, edge, joined = special
            if edge and _TAB in self._piece and edge_tab(self._piece, name):
                cur.error = cur.error or ClientError(400, f"a tab around the value of {lname!r}")
            if cur._seen & bit:
                cur._dup = lname
            cur._seen |= bit
        wanted = self.wanted
        if special is None and wanted is not None:  # the next time, one lookup (above)
            plain_table = self._plain
            if len(plain_table) >= 4096:  # clients choose names: bounded
                plain_table.clear()
            plain_table[name] = lname if lname in wanted else ""
        if wanted is not None and lname not in wanted:
            return
        v = value.decode("latin-1")
        if wanted is None:
            cur.headers.append((name.decode("latin-1"), v))
        if joined:  # RFC 9110 §5.3: repeated lines are one list
            if joined == XFF:
                cur.xff = v if cur.xff is None else f"{cur.xff}, {v}"
            elif lname in cur.fields:
                cur.fields[lname] = f"{cur.fields[lname]}, {v}"
                return
        if lname not in cur.fields:  # the first line wins (see Request.fields)
            cur.fields[lname] = v

    def _check_line(self, cur: Request) -> None:
        """llhttp also takes ``RTSP/1.0`` (and ``ICE/1.0`` after SOURCE) for a
        protocol, and reports it as HTTP/1.0; nginx refuses both (400), so do
        we.  The request line is in the bytes fed since the head began."""
        line = self._line
        method = self.parser.get_method()
        raw = self._piece if line is None else bytes(line) + self._piece
        if b"RTSP/" not in raw and b"ICE/" not in raw:
            return
        start = method + b" " + cur._url + b" "
        if start + b"RTSP/" in raw or start + b"ICE/" in raw or start not in raw:
            cur.error = ClientError(400, "not an HTTP request (RTSP or ICE protocol)")

    def on_headers_complete(self) -> None:
        cur = self.cur
        assert cur is not None
        if cur._size == 0:
            self._check_line(cur)
        self.in_head = False
        self._line = None
        p = self.parser
        m = p.get_method()
        method = _METHODS.get(m)
        if method is None:  # llhttp's names: a bounded set
            method = _METHODS[m] = m.decode("latin-1")
        cur.method = method
        if self._v11:  # read by on_header from the request line llhttp accepted
            self._v11 = False
            version = "1.1"
        else:
            version = p.get_http_version()
        cur.http10 = version == "1.0"
        cur.keep = p.should_keep_alive()
        f = cur.fields
        if self.head_bytes > self.limits.max_head:  # a head that arrived whole in one read
            cur.error = ClientError(431, f"the request head is larger than {self.limits.max_head} bytes")
        if cur.error is None:
            cur.error = check_head(cur, self.limits.max_headers, version)
        if cur.error is None and "expect" in f:
            if f["expect"].lower() == "100-continue":
                cur.expect_continue = not cur.http10
            else:
                cur.error = ClientError(417, "only 'Expect: 100-continue' is understood")
        te = f.get("transfer-encoding")
        cl = f.get("content-length")
        if te is not None or (cl is not None and cl != "0"):
            cur.body = Body(self, cur, int(cl) if te is None and cl is not None else None)
        q = self.queue
        q.append(cur)
        if len(q) > self.state.queued_max:
            self.state.queued_max = len(q)

    def on_body(self, data: bytes) -> None:
        cur = self.cur
        if cur is not None and cur.body is not None:
            cur.body.feed(data)

    def on_message_complete(self) -> None:
        cur = self.cur
        if cur is not None and cur.body is not None:
            cur.body.end()
        self.cur = None

    # -- answering, in order -------------------------------------------------------------

    def refuse(self, err: ClientError) -> None:
        """A request that cannot be parsed (or finish arriving): answered after the
        ones before it, then the connection closes."""
        self.stopped = True
        self.pending = None
        cur, self.cur = self.cur, None
        self.in_head = False
        if cur is not None and cur.body is not None and cur in self.queue:  # refused mid-body: its reader answers
            cur.keep = False
            cur.body.fail(err)
        else:
            req = Request()
            req.error = err
            req.keep = False
            self.queue.append(req)
        self._process()

    def _process(self) -> None:
        """Answer queued requests one after the other (a loop, never recursion)."""
        while self.queue and self.task is None and not self.closing:
            req = self.queue[0]
            if req.error is not None:
                err = req.error
                if err.status == 500:
                    pass  # counted and logged where it happened (_failed)
                elif err.status != 408:
                    self._note_bad(err)
                out: bytes | Awaitable[bytes | None] = responses.problem(
                    err.status, responses.REASONS.get(err.status, "Error"), err.detail, keep=False
                )
                req.keep = False
            else:
                try:
                    out = self.handler.handle(self, req)
                except ClientError as exc:
                    self._note_bad(exc)
                    out = responses.problem(exc.status, responses.REASONS.get(exc.status, "Error"), exc.detail,
                                            keep=False)  # fmt: skip
                    req.keep = False
                except Exception as bug:  # never out of data_received: one 500, one bounded log line
                    err = self._failed(bug)  # (a name of its own per except: mypyc, netlimit/compiled.py)
                    out = responses.problem(500, "Internal Server Error", err.detail, keep=False)
                    req.keep = False
            if isinstance(out, bytes):
                self._done(req, out)
                continue
            self.task = self._loop().create_task(self._wait(req, out))
            return
        if "pipeline" in self.paused and len(self.queue) <= self.limits.max_pipeline // 2:
            self.resume("pipeline")

    async def _wait(self, req: Request, pending: Awaitable[bytes | None]) -> None:
        out: bytes | None
        try:
            out = await pending
        except ClientError as exc:
            self._note_bad(exc)
            out = responses.problem(exc.status, responses.REASONS.get(exc.status, "Error"), exc.detail, keep=False)
            req.keep = False
        except (asyncio.CancelledError, ConnectionError):
            raise
        except Exception as bug:  # never leave the connection hanging; the log stays bounded
            err = self._failed(bug)
            out = responses.problem(500, "Internal Server Error", err.detail, keep=False)
            req.keep = False
        self.task = None
        self.now = _monotonic()
        self._done(req, out)
        if not self.closing:
            self._loop().call_soon(self._process)

    def _failed(self, exc: BaseException) -> ClientError:
        """The sidecar failed answering (a bug, not the client's doing): counted, and
        logged at most once per interval with where it happened, no traceback."""
        self.state.errors += 1
        held = _bad_log.due("handler-error")
        if held >= 0:
            tb = traceback.extract_tb(exc.__traceback__)
            where = f" at {tb[-1].filename}:{tb[-1].lineno}" if tb else ""
            more = f" ({held} more since the last report)" if held else ""
            log.error("the answer to a request from %s failed: %s: %s%s; 500%s",
                      self.peer, type(exc).__name__, str(exc)[:200], where, more,
                      extra={"client": self.peer})  # fmt: skip
            log.debug("the failure in full", exc_info=exc)
        return ClientError(500, "the sidecar failed; see its log")

    def _done(self, req: Request, out: bytes | None) -> None:
        """The answer of the oldest request is complete: send it and go on."""
        q = self.queue
        if q and q[0] is req:
            q.popleft()
        self.last = self.now  # idle from now (keepalive_timeout): the read just parsed, or _wait's clock
        body = req.body
        if body is None:  # the usual request (no body): fewer tests
            if out:
                self.write(out)
            if not req.keep or (self.stopped and not q):
                self._finish(linger=False)
            return
        unread = body is not None and not body.done
        if out:
            self.write(out, close=False)
        if not req.keep or (self.stopped and not self.queue) or unread:
            if body is not None:
                body.discard = True
            self._finish(linger=unread)

    def _finish(self, linger: bool) -> None:
        """Close after what is written; with an upload still arriving, stop writing
        and keep reading (and dropping) it for a moment so that the close does not
        reset the answer out of the client's buffer."""
        self.stopped = True
        self.closing = True
        self.pending = None
        t = self.transport
        if t is None:
            return
        self.state.flush_out()
        if linger and t.can_write_eof():
            try:
                t.write_eof()
            except OSError:
                t.close()
                return
            self.lingering = True  # drop everything that still comes
            self.stopped = False
            self.paused.clear()
            if not self.reading:
                self.reading = True
                t.resume_reading()
            self._loop().call_later(LINGER, t.close)
        else:
            t.close()

    def write(self, out: bytes, close: bool = False) -> None:
        """Send an answer at the end of this loop iteration, with every other answer
        the iteration produces, back to back and in order per connection.  Each
        write to a sleeping client wakes it; written back to back, the answers after
        the first find it awake (docs/performance.md)."""
        t = self.transport
        if t is None or t.is_closing():
            return
        total = self.out_total = self.out_total + len(out)
        state = self.state
        batch = state.out_batch
        if total - self.out_mark > self.limits.write_high and batch:
            # a read of pipelined requests answered at once: hand what is held to the
            # transport now, whose high-water mark then pauses reading (answers held
            # in the batch are invisible to it: a client that never reads grew us by
            # the whole of what the sidecar read in one loop iteration, +40-130 MiB)
            self.out_mark = total
            state.flush_out()
            if t.is_closing():
                return
            batch = None
        if batch is None:
            try:
                loop = self.loop or self._loop()
            except RuntimeError:  # driven by hand without a loop (tests): at once
                t.write(out)
                if close:
                    t.close()
                return
            batch = state.out_batch = []
            loop.call_soon(state.flush_out)
        batch.append((t, out, close))

    def write_now(self, out: bytes) -> None:
        """Send at once (after what is batched): a streamed response's parts."""
        t = self.transport
        if t is None or t.is_closing():
            return
        if self.state.out_batch:
            self.state.flush_out()
        self.out_total += len(out)
        t.write(out)

    async def drain(self) -> None:
        """Wait while the client's write buffer is above its high-water mark (the
        sweep aborts a client that reads nothing for ``send_timeout``)."""
        if self.write_paused and not self.closing:
            self._drained = self._loop().create_future()
            try:
                await self._drained
            finally:
                self._drained = None

    def close(self) -> None:
        """Close after the unsent answers (the sweep aborts the connection if they
        make no progress for ``send_timeout``)."""
        self.closing = True
        self.pending = None
        if self.transport is not None:
            self.state.flush_out()
            self.transport.close()

    def abort(self) -> None:
        """Close now, dropping what is unsent: the descriptor and buffers are freed."""
        self.closing = True
        self.pending = None
        if self.transport is not None:
            self.transport.abort()

    def _note_bad(self, err: ClientError) -> None:
        self.handler.bad_request()
        held = _bad_log.due("bad-request")
        if held >= 0:
            more = f" ({held} more since the last report)" if held else ""
            log.info(
                "request from %s refused with %d: %s%s",
                self.peer,
                err.status,
                err.detail[:200],
                more,
                extra={"client": self.peer, "status": err.status},
            )


def _reason(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text[:100]
