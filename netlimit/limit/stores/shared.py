"""The memory store shared by the workers of one sidecar (``netlimit sidecar
--workers N`` without Redis): one **state owner** process holds the
:class:`MemoryStore`; each worker's :class:`SharedMemoryStore` asks it over a
Unix socket, and leases quota for its hot keys as :mod:`.lease` does against
Redis, so a hot key is decided in the worker without a round trip and the
workers together still never admit over the limit.

Protocol (one stream per worker, requests answered in order): a frame is a
4-byte big-endian length and a :mod:`marshal`-ed tuple.  The socket lives in a
0700 directory the supervisor made; only the workers it started connect.

* ``(0, lid, fields, dynamic)`` defines limit ``lid`` of this connection (no answer);
* ``(1, lid, key, cost, extra, back, bw)`` gives back ``back`` units reserved in
  window ``bw``, decides ``cost`` and, when admitted, reserves up to ``extra``
  more units; answer ``(allowed, limit, remaining, retry_after, reset, delay,
  grant, w, given)``;
* ``(2, lid, key, cost)`` peeks; answer the first six fields;
* ``(3, lid, key, back, bw)`` gives back; answer ``given``.

Exactness: the owner decides every hit and every reservation on one store, one
at a time; a reserved unit is counted in its window before any worker admits
it, a lease is spent only before its window's end as seen from the worker
(``sent + reset``: at or before the owner's end) and for at most
:data:`LEASE_TTL`, and a give-back lowers a window's count only by units never
admitted, in the window they were reserved in.  Lyft's counting saturates a
window at its first denial, so units given back to a saturated window go to a
pool instead, from which the window's next hits are admitted (they were
reserved, never admitted): N workers offered twice the limit admit exactly the
limit, whichever worker holds the last lease.  A bucket's give-back sets its room to
``min(burst, room + unused)``, the room it would have had had those hits never
been taken (stores/lease.py's bucket argument: in wall time an interval may see
at most the quota held in leases more than ``burst + rate x length``).  Leases
cover the two fixed windows and the buckets (a leaky bucket without ``delay``);
the sliding windows ask the owner for every decision (one round trip, still exact).

The worker's socket calls block its event loop for one round trip (tens of µs
on loopback): the price of keeping the in-process fast path (``check_fast``)
for everything a lease answers.  When the owner cannot be reached, each worker
decides alone on its own in-process state (logged, at most every 10 s) until it
answers again: a limit then counts per worker (up to N times the limit).
"""

from __future__ import annotations

import asyncio
import logging
import marshal
import math
import os
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from time import monotonic
from typing import Any, cast

from ..algorithms import FIXED_WINDOW, FIXED_WINDOW_ADMITTED, LEAKY_BUCKET, TOKEN_BUCKET, Decision, Limit
from ..algorithms.base import _INF, DynamicLimit, _new
from .base import hash_key
from .lease import (
    HOT_RATE,
    LEASE_DEMAND,
    LEASE_FRACTION,
    LEASE_TTL,
    MAX_LEASES,
    Lease,
    LeaseClock,
    LeaseStats,
)
from .memory import MemoryStore

log = logging.getLogger("netlimit.limit")

_LEN = struct.Struct(">I")
#: the largest frame either side accepts (a key is at most max_key_length, a few KB)
MAX_FRAME = 64 * 1024
#: limits a worker defines on one connection; beyond, a limit is sent with every call
MAX_LIMITS = 4096
#: the leasing algorithms: (a denial lasts to the window's end (Lyft's counting), it has
#: windows); a leaky bucket with ``delay`` (queue mode) does not lease
LEASING = {
    FIXED_WINDOW: (True, True),
    FIXED_WINDOW_ADMITTED: (False, True),
    TOKEN_BUCKET: (False, False),
    LEAKY_BUCKET: (False, False),
}
#: keys holding units given back to a saturated window, at most
MAX_POOL = 65_536
#: seconds between two attempts to reach an owner that did not answer
RETRY = 0.5

OP_DEF, OP_HIT, OP_PEEK, OP_BACK = 0, 1, 2, 3


@dataclass(slots=True)
class _Held(Lease):
    """A worker's lease, with what its give-back needs."""

    limit: Any = None
    key: str = ""


# -- the owner ------------------------------------------------------------------------


def _held(store: MemoryStore, key: str, limit: Limit) -> tuple[dict[str, Any] | None, Any]:
    """The table holding ``key``'s state under ``limit`` and the state (None, None if none)."""
    for gen in (store._young, store._old):
        t = gen.get(limit._ns)
        if t is not None:
            s = t.get(key)
            if s is not None:
                return t, s
    return None, None


def give_back(store: MemoryStore, key: str, limit: Limit, n: int, w: int) -> int:
    """Lower the count of ``key``'s window ``w`` by at most ``n`` unused reserved
    units; nothing once the window moved on or is over its limit.  Returns the
    units given back."""
    how = LEASING.get(limit.algorithm)
    if n <= 0 or how is None:
        return 0
    if len(key) > store._max_key_length:
        key = hash_key(key)
    table, state = _held(store, key, limit)
    if table is None:
        return 0
    if not how[1]:  # a bucket: the room it would have had had those hits never been taken
        now = time.time()
        cap, free, last = limit._cap, state.real, state.imag
        if now > last:
            free = min(cap, free + (now - last) * limit._rate)
            last = now
        g = min(n, max(0, math.floor(cap - free)))
        table[key] = min(cap, free + n) + 1j * last
        return g
    b = limit._cb
    count = state & limit._cm
    if state >> b != w or count > limit.limit:
        return 0
    g = min(n, count)
    table[key] = (w << b) | (count - g)
    return g


class Owner:
    """The state owner: one :class:`MemoryStore` answering the workers' frames."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.clients = 0
        #: Lyft's counting: units given back to a window already saturated by a denial,
        #: {(namespace, key): [window, units]}; admitted before the saturated count
        #: denies (they were reserved, never admitted)
        self.pool: dict[tuple[str, str], list[int]] = {}

    def back(self, limit: Limit, key: str, n: int, w: int) -> int:
        """Give back ``n`` units of window ``w``; into the pool when Lyft's count saturated it."""
        store = self.store
        given = give_back(store, key, limit, n, w)
        if given < n and LEASING.get(limit.algorithm, (False,))[0]:
            k = key if len(key) <= store._max_key_length else hash_key(key)
            _, state = _held(store, k, limit)
            if state is not None and state >> limit._cb == w and state & limit._cm > limit.limit:
                p = self.pool.get((limit._ns, k))
                if p is None or p[0] != w:
                    if len(self.pool) >= MAX_POOL:  # bounded: the units are lost (early denials only)
                        return given
                    p = self.pool[(limit._ns, k)] = [w, 0]
                p[1] += n - given
                given = n
        return given

    def _from_pool(self, limit: Limit, key: str, cost: int, now: float) -> tuple | None:
        k = key if len(key) <= self.store._max_key_length else hash_key(key)
        p = self.pool.get((limit._ns, k))
        if p is None:
            return None
        w = math.floor(now / limit.period)
        if p[0] < w:  # the window ended: its pool with it
            del self.pool[(limit._ns, k)]
            return None
        if cost > p[1]:
            return None
        p[1] -= cost
        if not p[1]:
            del self.pool[(limit._ns, k)]
        reset = (p[0] + 1) * limit.period - now
        return (True, limit.limit, p[1], 0.0, reset, 0.0, 0, -1)

    def hit(self, limit: Limit, key: str, cost: int, extra: int, back: int, bw: int) -> tuple:
        store = self.store
        now = time.time()
        given = self.back(limit, key, back, bw) if back else 0
        if self.pool and cost > 0 and (r := self._from_pool(limit, key, cost, now)) is not None:
            return (*r, given)
        d = store.hit_sync(key, limit, cost, now)
        grant, w = 0, -1
        how = LEASING.get(limit.algorithm)
        if extra > 0 and d.allowed and cost > 0 and how is not None and not limit._dynamic and not limit.delay:
            grant = min(extra, d.remaining)
            if grant:
                store.hit_sync(key, limit, grant, now)  # within the remaining: admitted (same window)
                d.remaining -= grant
            if how[1]:
                k = key if len(key) <= store._max_key_length else hash_key(key)
                _, state = _held(store, k, limit)
                w = state >> limit._cb if state is not None else -1
                if w < 0:
                    grant = 0
            else:
                w = 0
        return (d.allowed, d.limit, d.remaining, d.retry_after, d.reset, d.delay, grant, w, given)

    def answer(self, limits: dict[int, Limit], msg: tuple) -> tuple | int | None:
        op = msg[0]
        if op == OP_HIT:
            return self.hit(limits[msg[1]], msg[2], msg[3], msg[4], msg[5], msg[6])
        if op == OP_DEF:
            fields = msg[2]
            limits[msg[1]] = (DynamicLimit if msg[3] else Limit)(*fields)
            return None
        if op == OP_PEEK:
            d = self.store.peek_sync(msg[2], limits[msg[1]], msg[3])
            return (d.allowed, d.limit, d.remaining, d.retry_after, d.reset, d.delay)
        if op == OP_BACK:
            return self.back(limits[msg[1]], msg[2], msg[3], msg[4])
        raise ValueError(f"unknown op {op!r}")


class _OwnerConn(asyncio.Protocol):
    def __init__(self, owner: Owner) -> None:
        self.owner = owner
        self.buf = b""
        self.limits: dict[int, Limit] = {}
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.owner.clients += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner.clients -= 1

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        out = []
        i, n = 0, len(buf)
        answer = self.owner.answer
        try:
            while n - i >= 4:
                (size,) = _LEN.unpack_from(buf, i)
                if size > MAX_FRAME:
                    raise ValueError(f"frame of {size} bytes")
                if n - i - 4 < size:
                    break
                msg = marshal.loads(buf[i + 4 : i + 4 + size])
                i += 4 + size
                r = answer(self.limits, msg)
                if r is not None:
                    p = marshal.dumps(r)
                    out.append(_LEN.pack(len(p)) + p)
        except Exception as exc:  # a malformed frame (a bug of a worker): drop that worker's connection
            log.error("shared state: dropping a worker connection: %r", exc)
            self.transport.abort()
            return
        self.buf = buf[i:]
        if out:
            self.transport.write(b"".join(out))


async def serve_owner(path: str, store: MemoryStore, ready: Callable[[], None] | None = None) -> None:
    """Serve ``store`` on the Unix socket ``path`` until cancelled."""
    owner = Owner(store)
    loop = asyncio.get_running_loop()
    server = await loop.create_unix_server(lambda: _OwnerConn(owner), path)
    os.chmod(path, 0o600)
    if ready is not None:
        ready()
    try:
        await asyncio.Event().wait()
    finally:
        server.close()


def _back(key: str, left: int, w: int, lid: int) -> tuple:
    return (OP_BACK, lid, key, left, w)


# -- the worker's side ----------------------------------------------------------------


class SharedMemoryStore(LeaseClock, MemoryStore):
    """A worker's store: the owner's state behind a Unix socket, leases for hot
    keys (module doc).  It is a :class:`MemoryStore` to the limiter (decided
    synchronously, ``check_fast``); its own in-process state is the fallback
    while the owner cannot be reached."""

    def __init__(self, path: str, *, timeout: float = 1.0, leases: bool = True, **kw: Any) -> None:
        super().__init__(**kw)
        self.path = path
        self.timeout = timeout
        self.leases = leases
        self.lease_stats = LeaseStats()
        self.owner_errors = 0
        self._sock: socket.socket | None = None
        self._down_until = 0.0
        self._logged = 0.0
        self._buf = b""
        self._ids: dict[tuple, int] = {}
        self._leases: dict[str, _Held] = {}  # type: ignore[assignment]  # a Lease with its limit and key
        self._start_clock()

    # -- the socket --

    def _connect(self) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self.path)
        except OSError:
            s.close()
            raise
        self._sock = s
        self._buf = b""
        self._ids = {}
        return s

    def _lid(self, limit: Limit, frames: list[bytes]) -> int:
        fields = (limit.algorithm, limit.limit, limit.period, limit.burst, limit.delay, limit.name)
        k = (limit._dynamic, fields)
        lid = self._ids.get(k)
        if lid is None:
            if len(self._ids) >= MAX_LIMITS:
                lid = 0  # sent with this call, forgotten after
            else:
                lid = self._ids[k] = len(self._ids) + 1
            p = marshal.dumps((OP_DEF, lid, fields, limit._dynamic))
            frames.append(_LEN.pack(len(p)) + p)
        return lid

    def _calls(self, make: list[Callable[[int], tuple]], limits: list[Limit]) -> list[Any]:
        """Send one request per entry (each given its limit's id), read the answers in order."""
        s = self._sock or self._connect()
        frames: list[bytes] = []
        for fn, limit in zip(make, limits):
            lid = self._lid(limit, frames)
            p = marshal.dumps(fn(lid))
            frames.append(_LEN.pack(len(p)) + p)
        s.sendall(b"".join(frames))
        out: list[Any] = []
        buf = self._buf
        while len(out) < len(make):
            while len(buf) < 4 or len(buf) < 4 + _LEN.unpack_from(buf)[0]:
                chunk = s.recv(65536)
                if not chunk:
                    raise ConnectionResetError("the shared state's owner closed the connection")
                buf += chunk
            (size,) = _LEN.unpack_from(buf)
            out.append(marshal.loads(buf[4 : 4 + size]))
            buf = buf[4 + size :]
        self._buf = buf
        if len(self._ids) >= MAX_LIMITS:
            self._ids = {k: v for k, v in self._ids.items() if v}
        return out

    def _call(self, fn: Callable[[int], tuple], limit: Limit) -> Any:
        if self._down_until:
            if monotonic() < self._down_until:
                raise ConnectionError("the shared state's owner is down")
            self._down_until = 0.0
        try:
            return self._calls([fn], [limit])[0]
        except (OSError, EOFError, ValueError) as exc:
            self._lost(exc)
            raise ConnectionError(str(exc)) from exc

    def _lost(self, exc: BaseException) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self.owner_errors += 1
        self._leases.clear()  # reservations of a gone owner are gone with it
        self._down_until = monotonic() + RETRY
        now = monotonic()
        if now - self._logged >= 10.0:
            self._logged = now
            log.error(
                "shared state at %s unreachable (%r): this worker decides alone until it answers "
                "(limits count per worker meanwhile)",
                self.path,
                exc,
            )

    # -- the local rate and the idle sweep: LeaseClock (stores/lease.py) --

    def _sweep_due(self, now: float) -> None:
        self._sweep(now)

    def _sweep(self, now: float, everything: bool = False) -> None:
        """Give back the unused part of the leases past their time, in one round trip."""
        st = self.lease_stats
        make: list[Callable[[int], tuple]] = []
        limits: list[Limit] = []
        units = []
        for _, due in self._take_due(now, everything):
            ls = cast(_Held, due)  # this store's leases carry their limit and key
            limit, key = ls.limit, ls.key
            make.append(partial(_back, key, ls.left, ls.w))
            limits.append(limit)
            units.append(ls.left)
        if not make or self._down_until or self._sock is None:
            st.return_errors += len(make)
            return
        try:
            given = self._calls(make, limits)
        except (OSError, EOFError, ValueError) as exc:
            st.return_errors += len(make)  # the units stay counted: fewer admitted, never more
            self._lost(exc)
            return
        for g, n in zip(given, units):
            st.returned_units += g
            st.expired_units += n - g

    # -- the decision --

    def hit_sync(self, key: str, limit: Limit, cost: int = 1, now: float | None = None) -> Decision:
        how = LEASING.get(limit.algorithm) if self.leases else None
        if how is None or cost <= 0 or limit._dynamic or limit._deny0 or limit.delay:
            try:
                r = self._call(lambda lid: (OP_HIT, lid, key, cost, 0, 0, -1), limit)
            except ConnectionError:
                return super().hit_sync(key, limit, cost)
            return Decision(r[0], r[1], r[2], r[3], r[4], r[5])
        k = limit._ns + key
        t = monotonic()
        self._seen(k, t)
        ls = self._leases.get(k)
        st = self.lease_stats
        if ls is not None and t < ls.until:
            d = _new(Decision)
            d.limit = limit._cap
            d.reset = ls.resets - t if ls.resets > t else 0.0
            d.delay = 0.0
            if ls.denied:
                if cost > ls.remaining:
                    d.allowed = False
                    d.remaining = ls.remaining
                    d.retry_after = _INF if cost > limit._cap else d.reset
                    st.decisions += 1
                    st.local += 1
                    return d
            elif ls.left >= cost:
                ls.left -= cost
                d.allowed = True
                d.remaining = ls.remaining
                d.retry_after = 0.0
                st.decisions += 1
                st.local += 1
                return d
        return self._renew(key, k, limit, cost, t, how)

    def _renew(self, key: str, k: str, limit: Limit, cost: int, t: float, how: tuple[bool, bool]) -> Decision:
        """One round trip: give back the previous lease's rest, decide, reserve for a hot key."""
        st = self.lease_stats
        st.decisions += 1
        st.round_trips += 1
        old = self._leases.pop(k, None)
        back, bw = 0, -1
        if old is not None and not old.denied and old.left:
            if t < old.wend:
                back, bw = old.left, old.w
            else:
                st.expired_units += old.left
        rate = self._rate(k, t)
        hot = rate >= HOT_RATE and (old is not None or len(self._leases) < MAX_LEASES)
        extra = min(math.ceil(rate * LEASE_DEMAND), max(1, math.floor(limit._cap * LEASE_FRACTION))) if hot else 0
        sent = monotonic()
        try:
            r = self._call(lambda lid: (OP_HIT, lid, key, cost, extra, back, bw), limit)
        except ConnectionError:
            return super().hit_sync(key, limit, cost)
        allowed, lim, remaining, retry_after, reset = r[0], r[1], r[2], r[3], r[4]
        grant, w, given = r[6], r[7], r[8]
        st.returned_units += given
        if back > given:
            st.expired_units += back - given
        windowed = how[1]
        wend = sent + reset if windowed else math.inf
        if allowed and grant > 0:
            ls = _Held(
                w, grant, min(wend, sent + LEASE_TTL), wend, remaining, sent + reset, False, limit=limit, key=key
            )
            self._leases[k] = ls
            st.granted += 1
            st.granted_units += grant
            self._arm()
        elif not allowed and hot and retry_after < math.inf:
            # a hot key's denial answers its hits for the retry time, at most LEASE_TTL (an early
            # denial at worst, never an admission); not to the window's end even where Lyft's
            # count saturates it: units given back to the owner's pool may still be admitted
            until = sent + min(retry_after, LEASE_TTL)
            ls = _Held(w, 0, until, wend, remaining, sent + retry_after, True, limit=limit, key=key)
            self._leases[k] = ls
        return Decision(allowed, lim, remaining, 0.0 if allowed else retry_after, reset)

    def peek_sync(self, key: str, limit: Limit, cost: int = 1, now: float | None = None) -> Decision:
        try:
            r = self._call(lambda lid: (OP_PEEK, lid, key, cost), limit)
        except ConnectionError:
            return super().peek_sync(key, limit, cost)
        return Decision(*r)

    def held(self) -> int:
        """Units reserved in this worker's leases and not used yet."""
        now = monotonic()
        return sum(ls.left for ls in self._leases.values() if now < ls.wend)

    async def close(self) -> None:
        """Give back every lease, then close the connection."""
        self._stop_clock()
        if self._leases and self._sock is not None:
            self._sweep(monotonic(), everything=True)
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self.clear()
