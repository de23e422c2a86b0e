"""Leased quota on the Redis store (``http.leases: on``): hot keys decided
locally from quota reserved in Redis beforehand, still exact.

A key is *hot* in this sidecar when its own recent local rate is at least
:data:`HOT_RATE` decisions per second (counted over the last one to two
:data:`TICK`; a key's first sight over those ticks is only a mark in a fixed
table, it is counted from its second sight on: the long tail of cold keys keeps
nothing per key and reads no clock).  For a hot key of a leasing algorithm (the two fixed windows,
the sliding window counter, the token bucket, the leaky bucket without ``delay``)
the store makes one atomic Lua call (``lua/*_lease.lua``) that decides
the hit exactly as today's script does and, when it is admitted, **reserves** up
to ``extra`` more units: they are added to the window's shared count (taken from
the bucket) like admitted hits.  The next hits on the key are answered from that
reservation in this process, without a round trip, until it is used up, it
expires (:data:`LEASE_TTL`) or the window ends.  The unused part goes back to the
window's count on the next call for the key (the same Lua call, before it
decides) or, for a key no longer asked about, from a sweep every tick; it is
given back only when the window is still the one it was reserved in (and not
over the limit: Lyft's counting keeps a window that denied once over to its
end).

Exactness: a unit is counted in Redis before it is admitted anywhere, and a
lease is used only before the end of its window as seen from this host (its
deadline is the window's ``reset`` from the moment the call was *sent*, earlier
than or at the server's end), so the admissions of a window never exceed its
limit, across any number of sidecars.  Giving back only lowers the count by
units that were never admitted.  The price is early denials: quota reserved by
one sidecar and unused is not available to another until it comes back.  A
lease holds at most the key's next :data:`LEASE_DEMAND` seconds of local demand
and at most :data:`LEASE_FRACTION` of the limit, so with N sidecars the quota held
unused is at most ``N * LEASE_FRACTION`` of the limit at any time.

A denial of Lyft's fixed window saturates the window's count until its end, so
a hot key's denial is remembered to the window's end and answered locally too.

Cold keys (and rules with ``lease: off``, limit overrides, cost-0 probes, other
algorithms, the redis-py client) keep exactly the one-round-trip path of
:class:`RedisStore`.  Redis down mid-lease: what is in hand is answered to its
end (it was reserved), then the limiter's ``on_store_failure`` applies.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
from collections.abc import Coroutine
from dataclasses import dataclass, field
from importlib import resources
from time import monotonic
from typing import Any

from ...errors import StoreError
from ..algorithms import (
    FIXED_WINDOW,
    FIXED_WINDOW_ADMITTED,
    LEAKY_BUCKET,
    SLIDING_WINDOW_COUNTER,
    TOKEN_BUCKET,
    Decision,
    Limit,
)
from ..algorithms.base import _INF, _new
from .base import hash_key
from .cluster import key_slot
from .redis import _STORE_FAILURES, RedisStore, _evalsha_frame, limit_lua
from .resp import RespError

log = logging.getLogger("netlimit.limit")

#: decisions per second on one key, in this sidecar, from which the key leases
HOT_RATE = 50.0
#: the rate is counted per tick (this long), over the current and the previous one
TICK = 0.1
#: a lease covers this many seconds of the key's local demand...
LEASE_DEMAND = 0.020
#: ...and at most this fraction of the limit (per sidecar and key)
LEASE_FRACTION = 0.05
#: a lease unused for this long is given back (or at its window's end, if sooner)
LEASE_TTL = 0.1
#: most leases (keys) held at once; a key beyond is decided as a cold one
MAX_LEASES = 10_000
#: most limits whose leasing is remembered (LeasedRedisStore._learn)
MAX_LIMITS = 4096
#: most keys whose rate is counted per tick; a key beyond is a cold one
MAX_TRACKED = 65_536
#: fewer sights of a key over this tick and the last than this and its rate is below
#: HOT_RATE whatever the time (the rate divides by at least one TICK): hit_leasing's cold
#: path needs no division (the margin keeps it below the float rounding of the rate)
_COLD_BELOW = HOT_RATE * TICK * (1 - 1e-9)
#: slots of the first-sight marks (LeaseClock._marks: one byte each, 256 KiB); two keys
#: in one slot only make a key counted from its first sight
#: instead of its second -- never more than its own sights: a cold key stays cold
_MARK_SLOTS = 1 << 18
_MARK_MASK = _MARK_SLOTS - 1
#: most leases given back per sweep (the rest wait for the next tick)
MAX_RETURNS = 256
#: a lease call that admitted is confirmed on a replica (``WAIT 1 <ms>``) when the key's
#: primary has one, before its answer and its lease are used: a failover to that replica
#: keeps the reservation (Redis replicates asynchronously otherwise).  WAIT holds the
#: primary's connection (decisions pipelined behind it wait), so it waits at most this
#: long and at most half the store's timeout
CONFIRM_MS = 50
#: a lease is renewed in the background (the same call, cost 0) once it is down to this
#: fraction of its grant, so concurrent decisions go on from it instead of all waiting
#: for the renewal's round trip when it runs dry
RENEW_AT = 0.5
#: how long a node's replica count (``ROLE``) is trusted before it is asked again
ROLE_TTL = 1.0
#: a node whose replica did not confirm in time grants no lease for this long
UNCONFIRMED_S = 1.0
#: the leasing algorithms: (their lease script, a denial lasts to the window's end
#: (Lyft's counting saturates the window), they have windows); a leaky bucket with
#: ``delay`` (queue mode) does not lease
LEASING = {
    FIXED_WINDOW: ("fixed_window_lease.lua", True, True),
    FIXED_WINDOW_ADMITTED: ("fixed_window_lease.lua", False, True),
    TOKEN_BUCKET: ("bucket_lease.lua", False, False),
    LEAKY_BUCKET: ("bucket_lease.lua", False, False),
    SLIDING_WINDOW_COUNTER: ("sliding_window_counter_lease.lua", False, True),
}


@dataclass(slots=True)
class Lease:
    """Quota of one key reserved in window ``w`` and not used yet."""

    w: int  # the window it was reserved in (index, as the script computes it)
    left: int  # units not used yet
    until: float  # monotonic: used before this (min(window end, sent + LEASE_TTL))
    wend: float  # monotonic: the window's end, seen conservatively (sent + reset); inf for a bucket
    remaining: int  # the window's remaining after the reservation (reported)
    resets: float  # monotonic: when the reported reset comes (the window's end, a bucket's refill)
    denied: bool = False  # a remembered denial: hits above `remaining` are denied until `until`
    low: int = -1  # renewed ahead (RENEW_AT) once `left` is at most this; -1: not (again)
    pending: int = 0  # units a renewal ahead under way may reserve (reported remaining is less by them)


@dataclass(slots=True)
class LeaseStats:
    """Counters of the leasing path (netlimit/limit/metrics.py)."""

    decisions: int = 0  # decisions of leasing rules (cost >= 1)
    round_trips: int = 0  # the Redis calls they made
    local: int = 0  # answered from a lease (or a remembered denial), no round trip
    granted: int = 0  # leases granted
    granted_units: int = 0
    returned_units: int = 0  # unused units given back to their window
    expired_units: int = 0  # unused units whose window ended first (nothing to give back)
    return_errors: int = 0  # give-backs that failed (the units stay counted: safe)
    confirms: int = 0  # WAIT calls: a lease call's writes confirmed on a replica (CONFIRM_MS)
    unconfirmed: int = 0  # ... not confirmed in time: the lease was dropped (its units stay counted)


@dataclass(slots=True)
class _Aside:
    """What a LeasedRedisStore keeps off the decision's path, in one attribute: a store
    instance with more than 29 attributes loses CPython 3.11's shared-key attribute
    fast path, which every cold decision's attribute reads pay (issue 33)."""

    #: the give-back sweep under way (LeasedRedisStore._sweep_due)
    sweeping: asyncio.Task | None = None
    #: renewals ahead under way (RENEW_AT)
    renewals: set[asyncio.Task] = field(default_factory=set)
    #: per primary (address): (its replicas as ROLE said, until when that is trusted)
    replicas: dict[str, tuple[int, float]] = field(default_factory=dict)
    #: per primary (address): until when it grants no lease (a replica did not confirm)
    unconfirmed: dict[str, float] = field(default_factory=dict)


_LEASE_LUA: dict[str, tuple[str, bytes]] = {}


def lease_lua(limit: Limit) -> tuple[str, bytes]:
    """The lease script of ``limit`` (the limit's constants line, the prelude,
    ``counts_denied``, fixed_window_lease.lua) and its SHA1."""
    s = _LEASE_LUA.get(limit._sig)
    if s is None:
        head = limit_lua(limit).split("\n", 1)[0]
        script, counts_denied, _ = LEASING[limit.algorithm]
        lua = resources.files(__package__).joinpath("lua")
        prelude = lua.joinpath("_prelude.lua").read_text("utf-8")
        body = lua.joinpath(script).read_text("utf-8")
        src = f"{head}\n{prelude}local counts_denied = {'true' if counts_denied else 'false'}\n{body}"
        s = _LEASE_LUA[limit._sig] = (src, hashlib.sha1(src.encode("utf-8")).hexdigest().encode())
    return s


class LeaseClock:
    """What every leasing store keeps besides its leases: each key's local rate over this
    tick and the last (a key is hot at :data:`HOT_RATE`), and the idle sweep. The store
    gives back leases past their time in :meth:`_sweep_due` (Redis: a task; the workers'
    owner: a call)."""

    _leases: dict[str, Lease]
    _cur: dict[str, int]
    _prev: dict[str, int]
    _tick_end: float
    _idle: asyncio.TimerHandle | None
    _marks: bytearray
    _stamp: int
    _fresh: int
    _marked_at: int
    lease_stats: LeaseStats

    @property
    def holds_leases(self) -> bool:
        """Whether any lease is held: when not, :meth:`from_lease` has nothing to answer
        and a cold decision skips the call (the limiter's hot path asks this first)."""
        return bool(self._leases)

    def _start_clock(self, marks: bool = False) -> None:
        self._cur = {}
        self._prev = {}
        #: when this tick ends (it began TICK before)
        self._tick_end = monotonic() + TICK
        #: the idle sweep: leases past their time are given back even when no decision comes
        self._idle = None
        #: first sights (``marks``: LeasedRedisStore.hit_leasing): per slot ``hash(key) &
        #: _MARK_MASK``, the tick a key of the slot was last seen in (its stamp, 1-255, 0:
        #: never); a key is counted in ``_cur`` from its second sight over this tick and the
        #: last on (fixed size, no key kept; zeroed when the stamps wrap, every 255 ticks)
        self._marks = bytearray(_MARK_SLOTS if marks else 0)
        self._stamp = 1  # this tick's (the stamps only grow: the table is cleared when they start again)
        #: a mark at least this is of this tick or the last (the last one's stamp, or this
        #: one's when the last tick is not the previous one)
        self._fresh = 1
        #: first sights are being marked: the timer rolls the ticks (no decision reads the
        #: clock) while leasing decisions come (their count at the last roll; -1: not marking)
        self._marked_at = -1

    def _sweep_due(self, now: float) -> None:
        raise NotImplementedError

    def _seen(self, k: str, now: float) -> None:
        if now >= self._tick_end:
            self._roll(now)
        cur = self._cur
        n = cur.get(k)
        if n is None:
            if len(cur) >= MAX_TRACKED:
                return
            n = 0
        cur[k] = n + 1

    def _rate(self, k: str, now: float) -> float:
        """Decisions per second on ``k`` over the previous tick and this one."""
        return (self._prev.get(k, 0) + self._cur.get(k, 0)) / (TICK + TICK + (now - self._tick_end))

    def _roll(self, now: float) -> None:
        on = now - self._tick_end < TICK  # the last tick is the previous one (no tick without a roll between)
        self._prev = self._cur if on else {}
        self._cur = {}
        t = self._stamp
        if t == 255:  # the stamps start again from an empty table (256 KiB zeroed every 25.5 s at most)
            self._marks[:] = bytes(len(self._marks))
            t = 0
        self._stamp = t + 1
        self._fresh = t if on and t else t + 1
        self._tick_end = now + TICK
        if self._leases:
            self._sweep_due(now)

    def _arm(self) -> None:
        """Wake up when the tick ends while leases are held (or first sights marked): a
        store that goes quiet still gives back what it did not use when its leases end,
        not at its next decision (which may come after the window: early denials for
        every other process until then); the marks age without a clock read per decision."""
        if self._idle is None and (self._leases or self._marked_at >= 0):
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # outside a loop (tests of the rate alone): the next decision sweeps
                return
            self._idle = loop.call_later(max(self._tick_end - monotonic(), 0.001), self._on_idle)

    def _mark(self) -> None:
        """A first sight is marked with no timer running: the tick is brought up to date
        and the timer started (LeasedRedisStore.hit_leasing)."""
        now = monotonic()
        if now >= self._tick_end:
            self._roll(now)
        self._marked_at = self.lease_stats.decisions
        self._arm()

    def _on_idle(self) -> None:
        self._idle = None
        now = monotonic()
        if now >= self._tick_end:
            self._roll(now)
            if self._marked_at >= 0:  # the ticks go on while leasing decisions come
                n = self.lease_stats.decisions
                self._marked_at = n if n != self._marked_at else -1
        self._arm()

    def _take_due(self, now: float, everything: bool = False, most: int | None = None) -> list[tuple[str, Lease]]:
        """Take the leases past their time (all with ``everything``, at most ``most``) out
        of the table and return those with units to give back; a denial or an empty lease
        has none, a lease whose window ended counts as expired (nothing to give back to)."""
        st = self.lease_stats
        due = [(k, ls) for k, ls in self._leases.items() if everything or now >= ls.until]
        back = []
        for k, ls in due if most is None else due[:most]:
            del self._leases[k]
            if ls.denied or not ls.left:
                continue
            if now >= ls.wend:
                st.expired_units += ls.left
                continue
            back.append((k, ls))
        return back

    def _stop_clock(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None


class LeasedRedisStore(LeaseClock, RedisStore):
    """A :class:`RedisStore` that leases quota for hot keys (module doc).  The
    limiter calls :meth:`from_lease` first (no coroutine), then
    :meth:`hit_leasing` for a rule that leases; :meth:`hit` is today's path."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stats = LeaseStats()
        #: cold decisions (hit_leasing's one-trip path) not yet added to the stats' decisions
        #: and round trips (one counter on the cold path instead of two: :attr:`lease_stats`)
        self._cold = 0
        self._leases: dict[str, Lease] = {}
        #: the leases in hand (the same dict, never replaced; read-only outside): the limiter
        #: asks from_lease only while it is not empty (an attribute read, not a call)
        self.leases = self._leases
        #: the keys whose lease call is under way (other decisions on them wait for it)
        self._inflight: dict[str, asyncio.Future] = {}
        self._aside = _Aside()
        #: per Limit._ns: whether its rule leases here (hit_leasing; bounded by MAX_LIMITS)
        self._leasable: dict[str, bool] = {}
        self._start_clock(marks=True)

    @property
    def lease_stats(self) -> LeaseStats:  # type: ignore[override]  # LeaseClock declares it; read-only here
        """The counters (:class:`LeaseStats`), the cold decisions counted so far included."""
        st = self._stats
        n = self._cold
        if n:
            self._cold = 0
            st.decisions += n
            st.round_trips += n
        return st

    def _sweep_due(self, now: float) -> None:
        a = self._aside
        if a.sweeping is None or a.sweeping.done():
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # called outside a loop (tests of the rate alone): no sweep
                return
            a.sweeping = loop.create_task(self._sweep(now))

    # -- the decision -------------------------------------------------------------

    def from_lease(self, key: str, limit: Limit, cost: int) -> Decision | None:
        """The decision from the key's lease, or None (no usable lease: call
        :meth:`hit_leasing`)."""
        if not self._leases:
            return None
        k = limit._ns + key
        ls = self._leases.get(k)
        if ls is None or cost <= 0:
            return None
        now = monotonic()
        self._seen(k, now)
        if now >= ls.until:
            return None
        st = self._stats
        d = _new(Decision)
        d.limit = limit._cap  # the limit (windows), the burst (buckets)
        d.reset = ls.resets - now if ls.resets > now else 0.0
        d.delay = 0.0
        if ls.denied:
            if cost <= ls.remaining:  # a smaller hit may pass: ask Redis
                return None
            d.allowed = False
            d.remaining = ls.remaining
            d.retry_after = _INF if cost > limit._cap else d.reset
        elif ls.left >= cost:
            ls.left -= cost
            if ls.left <= ls.low:
                self._renew_ahead(k, key, limit, ls)
            d.allowed = True
            d.remaining = ls.remaining - ls.pending if ls.pending < ls.remaining else 0
            d.retry_after = 0.0
        else:
            return None
        st.decisions += 1
        st.local += 1
        return d

    def hit_leasing(self, key: str, limit: Limit, cost: int = 1) -> Coroutine[Any, Any, Decision]:
        """A decision of a rule that leases, when :meth:`from_lease` had none (await
        it): a cold key (or one not leasing) goes the one-trip way; a hot one renews
        its lease, giving back the previous one's rest in the same call.

        Not a coroutine itself: a cold key -- no lease, no call under way, fewer
        sights over this tick and the last than a hot key needs
        (:data:`_COLD_BELOW`) -- is handed :meth:`RedisStore.hit`'s own coroutine.
        Its first sight over this tick and the last is only a mark (a byte in
        ``_marks``: no clock read, nothing kept per key), and it is counted in
        one int (``_cold``, folded into :attr:`lease_stats` when read), so the
        long tail of per-address keys pays a hash and a few attribute reads for
        leases, no extra coroutine level (issue 33: cold keys within 0.9-1.1x of
        leases off)."""
        try:
            leases = self._leasable[limit._ns]
        except KeyError:
            leases = self._learn(limit)
        if not leases or cost <= 0:
            return self.hit(key, limit, cost)
        if self._inflight or self._leases:
            k = limit._ns + key
            if k in self._inflight or k in self._leases:
                return self._hit_leasing(key, limit, cost, k, -1.0)
        m = self._marks
        h = hash(key) & _MARK_MASK
        if m[h] >= self._fresh:  # seen over this tick or the last (this key, or one of its slot)
            k = limit._ns + key
            now = monotonic()
            if self._seen_again(k, h, now) >= _COLD_BELOW:  # may be hot: the rate decides
                return self._hit_leasing(key, limit, cost, k, now)
        else:  # a first sight: marked only
            m[h] = self._stamp
            if self._idle is None:
                self._mark()
        self._cold += 1  # a decision and its round trip (lease_stats)
        return self.hit(key, limit, cost)

    def _learn(self, limit: Limit) -> bool:
        """Whether hit_leasing leases for ``limit`` (its namespace: equal Limits share it):
        an algorithm that leases, not an override, not queue mode, not a limit of 0, and
        the store's own client (not redis-py)."""
        ok = limit.algorithm in LEASING and not limit._dynamic and not limit.delay and not limit._deny0 and self._lean
        if len(self._leasable) >= MAX_LIMITS:  # bounded: limits of reloads past
            self._leasable.clear()
        self._leasable[limit._ns] = ok
        return ok

    def _seen_again(self, k: str, h: int, now: float) -> float:
        """Count a sight of ``k`` (of mark slot ``h``), and its sights over this tick and
        the last (:meth:`LeaseClock._seen`, the first sight not counted)."""
        if now >= self._tick_end:
            self._roll(now)
        self._marks[h] = self._stamp
        cur = self._cur
        n = cur.get(k, 0)
        if n or len(cur) < MAX_TRACKED:
            n += 1
            cur[k] = n
        return n + self._prev.get(k, 0) if self._prev else n

    async def _hit_leasing(self, key: str, limit: Limit, cost: int, k: str, seen: float) -> Decision:
        """:meth:`hit_leasing` of a key with a lease or a call under way, or one seen
        often enough to be hot (``seen``: when it was counted; -1: not counted yet)."""
        _, counts_denied, windowed = LEASING[limit.algorithm]
        while (fut := self._inflight.get(k)) is not None:  # a renewal of this key is under way: one at a time
            await asyncio.shield(fut)
            d = self.from_lease(key, limit, cost)
            if d is not None:
                return d
        st = self._stats
        st.decisions += 1
        st.round_trips += 1
        now = monotonic() if seen < 0 else seen
        old = self._leases.pop(k, None)
        if old is None and seen < 0:
            self._seen(k, now)
        rate = self._rate(k, now)
        back, bw = 0, -1
        if old is not None and not old.denied and old.left:
            if now < old.wend:
                back, bw = old.left, old.w
            else:
                st.expired_units += old.left
        hot = rate >= HOT_RATE and (old is not None or len(self._leases) < MAX_LEASES)
        unconfirmed = self._aside.unconfirmed
        if hot and unconfirmed and unconfirmed.get(self._where_of(key, limit), 0.0) > now:
            hot = False  # its replica did not confirm lately: the one-trip path (see CONFIRM_MS)
        if not hot and not back:
            return await self.hit(key, limit, cost)
        extra = min(math.ceil(rate * LEASE_DEMAND), max(1, math.floor(limit._cap * LEASE_FRACTION))) if hot else 0
        sent = monotonic()
        fut = self._inflight[k] = asyncio.get_running_loop().create_future()
        try:
            res = await self._lease_call(key, limit, cost, extra, back, bw)
            try:
                allowed, lim, remaining = res[0] == 1, int(res[1]), int(res[2])
                retry_after, reset = float(res[3]), float(res[4])
                grant, w, given = int(res[6]), int(res[7]), int(res[8])
                # the window's end: the reply's 10th field where reset is not it (the sliding counter)
                ends = float(res[9]) if len(res) > 9 else reset
            except (TypeError, ValueError, IndexError) as e:
                raise StoreError(f"redis lease for {key!r}: unexpected reply {res!r:.200}") from e
            # an admission (and its lease) is used once a replica has it: a failover keeps it
            confirmed = not allowed or await self._confirm(key, limit)
        finally:
            del self._inflight[k]
            fut.set_result(None)
        st.returned_units += given
        if back > given:  # the window was over (or had moved on): nothing to give back to
            st.expired_units += back - given
        if not confirmed:
            st.expired_units += grant  # counted in Redis, never admitted: fewer admissions, never more
            grant = 0
        wend = sent + ends if windowed else math.inf
        if allowed and grant > 0:
            ls = Lease(w, grant, min(wend, sent + LEASE_TTL), wend, remaining, sent + reset)
            ls.low = int(grant * RENEW_AT) if grant > 1 else -1
            other = self._leases.get(k)  # a concurrent call's lease meanwhile
            if other is not None and other.w == w and not other.denied:
                ls.left += other.left
                ls.until = max(ls.until, other.until)
            elif other is not None and other.left:
                st.expired_units += other.left
            self._leases[k] = ls
            st.granted += 1
            st.granted_units += grant
            self._arm()
        elif not allowed and hot and k not in self._leases and retry_after < math.inf:
            # a denial answers this key's bigger hits for a while: Lyft's window is saturated to its
            # end; elsewhere for the retry time, at most LEASE_TTL (a give-back elsewhere may free
            # quota sooner: an early denial, never an admission too many)
            until = wend if counts_denied else sent + min(retry_after, LEASE_TTL)
            self._leases[k] = Lease(w, 0, until, wend, remaining, sent + retry_after, True)
        return Decision(allowed, lim, remaining, 0.0 if allowed else retry_after, reset)

    def _renew_ahead(self, k: str, key: str, limit: Limit, ls: Lease) -> None:
        """Start a renewal of ``ls`` in the background (at most one per key: none
        while a call on the key is under way); its grant is added to the lease."""
        ls.low = -1
        if k in self._inflight:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # from_lease called outside a loop (a test of the lease alone): no renewal
            return
        now = monotonic()
        # what the lease in hand and the renewal hold together stays within LEASE_FRACTION
        cap = max(1, math.floor(limit._cap * LEASE_FRACTION))
        extra = min(math.ceil(self._rate(k, now) * LEASE_DEMAND), cap - ls.left)
        if extra <= 0:
            return
        fut = self._inflight[k] = loop.create_future()
        ls.pending = extra  # reserved in Redis before its reply comes: not reported as remaining meanwhile
        t = loop.create_task(self._renew(k, key, limit, fut, extra, ls))
        self._aside.renewals.add(t)  # at most one per key (the in-flight mark)
        t.add_done_callback(self._aside.renewals.discard)

    async def _renew(self, k: str, key: str, limit: Limit, fut: asyncio.Future, extra: int, was: Lease) -> None:
        st = self._stats
        try:
            now = monotonic()
            unconfirmed = self._aside.unconfirmed
            if unconfirmed and unconfirmed.get(self._where_of(key, limit), 0.0) > now:
                return
            sent = monotonic()
            st.round_trips += 1
            try:
                res = await self._lease_call(key, limit, 0, extra, 0, -1)
                allowed, remaining, reset = res[0] == 1, int(res[2]), float(res[4])
                grant, w = int(res[6]), int(res[7])
                ends = float(res[9]) if len(res) > 9 else reset
                if not allowed or grant <= 0 or not await self._confirm(key, limit):
                    if allowed and grant > 0:
                        st.expired_units += grant
                    return
            # the lease in hand goes on; when it runs dry its key asks again the usual way
            except (StoreError, TypeError, ValueError, IndexError) as e:
                log.debug("redis lease: renewal ahead of %r failed: %r", key, e)
                return
        finally:
            del self._inflight[k]
            fut.set_result(None)
            was.pending = 0
        st.granted += 1
        st.granted_units += grant
        windowed = LEASING[limit.algorithm][2]
        wend = sent + ends if windowed else math.inf
        ls = self._leases.get(k)
        # units of the same window are usable to its end whatever their lease's time (that only
        # hastens give-backs): the lease in hand, run out of time or not, takes the grant
        if ls is not None and ls.w == w and not ls.denied:
            ls.left += grant
            ls.until = max(ls.until, min(wend, sent + LEASE_TTL))
            ls.remaining, ls.resets = remaining, sent + reset
        else:
            if ls is not None and ls.left and not ls.denied:
                st.expired_units += ls.left  # its window (or time) is over: given back by nobody, never used
            ls = self._leases[k] = Lease(w, grant, min(wend, sent + LEASE_TTL), wend, remaining, sent + reset)
        self._arm()
        ls.low = int(ls.left * RENEW_AT) if ls.left > 1 else -1

    def held(self) -> int:
        """Units reserved in leases and not used yet (the metric's gauge)."""
        now = monotonic()
        return sum(ls.left for ls in self._leases.values() if now < ls.wend)

    def held_by_ns(self) -> dict[str, int]:
        """:meth:`held` per ``Limit._ns`` (per rule: the metric's per-rule gauge)."""
        now = monotonic()
        out: dict[str, int] = {}
        for k, ls in self._leases.items():
            if ls.left and now < ls.wend:
                ns = k[: k.index(":") + 1]
                out[ns] = out.get(ns, 0) + ls.left
        return out

    # -- Redis -----------------------------------------------------------------------

    async def _lease_call(self, key: str, limit: Limit, cost: int, extra: int, back: int, bw: int) -> Any:
        """One EVALSHA of the lease script on the key's server (NOSCRIPT and
        redirects as :meth:`RedisStore._slow` handles them)."""
        src, sha = lease_lua(limit)
        argv = (b"%d" % cost, b"", b"0", b"%d" % extra, b"%d" % back, b"%d" % bw)
        rkey = self._rkey(key, limit)
        frame = _evalsha_frame(sha, argv)
        data = b"%b$%d\r\n%b\r\n%b" % (frame[0], len(rkey), rkey, frame[1])
        if self._slots is not None:
            node = self._slots[key_slot(rkey)]
        elif self._sentinel is not None:
            node = self._sentinel.primary
        else:
            node = self._node
        t0 = monotonic()
        try:
            if node is None:
                return await self._slow(None, node, limit, data, rkey, t0, src)
            try:
                return await node.send_packed(data)
            except RespError as e:
                return await self._slow(e, node, limit, data, rkey, t0, src)
        except _STORE_FAILURES as e:
            raise StoreError(f"redis lease {limit.algorithm} for {key!r}: {e!r}") from e

    def _rkey(self, key: str, limit: Limit) -> bytes:
        head = f"{self._prefix}:{{{limit._sig}:"
        return ((head + key if len(key) <= self._max_key_length else head + hash_key(key)) + "}").encode(
            "utf-8", "surrogatepass"
        )

    def _node_of(self, rkey: bytes) -> Any:
        """The primary a call for ``rkey`` goes to now (None: not known yet)."""
        if self._slots is not None:
            return self._slots[key_slot(rkey)]
        if self._sentinel is not None:
            return self._sentinel.primary
        return self._node

    def _where_of(self, key: str, limit: Limit) -> str:
        node = self._node_of(self._rkey(key, limit))
        return "" if node is None else str(node.address)

    async def _confirm(self, key: str, limit: Limit) -> bool:
        """After a lease call that admitted: its writes are on a replica of the key's
        primary (``WAIT 1``), or the primary has none (``ROLE``, asked at most every
        ROLE_TTL).  False: not confirmed within CONFIRM_MS (the node then grants no
        lease for UNCONFIRMED_S).  A lost connection raises StoreError (the limiter's
        on_store_failure decides this hit)."""
        node = self._node_of(self._rkey(key, limit))
        if node is None:  # the map was dropped meanwhile: nothing to wait on, nothing leased
            return False
        where = str(node.address)
        st = self._stats
        now = monotonic()
        try:
            replicas = self._aside.replicas
            known = replicas.get(where)
            if known is None or known[1] <= now:
                st.round_trips += 1
                role = await node.execute_command(b"ROLE")
                n = len(role[2]) if role and role[0] == b"master" and len(role) > 2 else 0
                if len(replicas) >= 1024:  # bounded: a cluster has a few primaries
                    replicas.clear()
                replicas[where] = known = (n, now + ROLE_TTL)
            if known[0] == 0:
                return True
            st.round_trips += 1
            st.confirms += 1
            ms = max(1, min(CONFIRM_MS, int(self._timeout * 500)))
            acked = await node.execute_command(b"WAIT", b"1", b"%d" % ms, timeout=self._timeout + ms / 1000)
        except _STORE_FAILURES as e:
            raise StoreError(f"redis lease {limit.algorithm} for {key!r}: WAIT at {where}: {e!r}") from e
        if int(acked) >= 1:
            return True
        st.unconfirmed += 1
        unconfirmed = self._aside.unconfirmed
        if len(unconfirmed) >= 1024:
            unconfirmed.clear()
        unconfirmed[where] = monotonic() + UNCONFIRMED_S
        log.warning("redis lease: no replica of %s confirmed within %d ms: no leases there for %.0f s",
                    where, ms, UNCONFIRMED_S)  # fmt: skip
        return False

    async def _sweep(self, now: float, everything: bool = False) -> None:
        """Give back the unused part of the leases past their time (all of them
        with ``everything``), at most MAX_RETURNS per sweep."""
        st = self._stats
        calls = []
        for k, ls in self._take_due(now, everything, None if everything else MAX_RETURNS):
            limit, key = _limit_key(k)
            if limit is None:
                st.expired_units += ls.left
                continue
            calls.append((ls, self._lease_call(key, limit, 0, 0, ls.left, ls.w)))
        if not calls:
            return
        outs = await asyncio.gather(*(c for _, c in calls), return_exceptions=True)
        for (ls, _), out in zip(calls, outs):
            st.round_trips += 1
            if isinstance(out, StoreError):  # the units stay counted in their window: fewer admitted, never more
                st.return_errors += 1
                continue
            if isinstance(out, BaseException):
                raise out
            try:
                given = int(out[8])
            except (TypeError, ValueError, IndexError):
                st.return_errors += 1
                continue
            st.returned_units += given
            st.expired_units += ls.left - given

    async def close(self) -> None:
        """Give back every lease (best effort, within the store's timeout), then close."""
        self._stop_clock()
        a = self._aside
        if a.sweeping is not None and not a.sweeping.done():
            await asyncio.gather(a.sweeping, return_exceptions=True)
        if a.renewals:
            await asyncio.gather(*a.renewals, return_exceptions=True)
        if self._leases:
            await self._sweep(monotonic(), everything=True)
        await super().close()


def _limit_key(k: str) -> tuple[Limit | None, str]:
    """The Limit and key of a lease's dict key (``Limit._ns`` + key)."""
    from ..algorithms.base import _LIMIT_BY_NS

    ns, _, key = k.partition(":")
    return _LIMIT_BY_NS.get(ns + ":"), key
