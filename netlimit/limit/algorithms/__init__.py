"""The five L7 rate-limit algorithms as small pure functions.

Every algorithm has the shape ``f(limit, state, now, cost) -> (Decision, new_state)``.
``state`` is ``None`` for a key never seen (or forgotten); ``now`` is the caller's
clock in seconds (injected in tests; ``time.time()`` in the memory store, the
Redis server's ``TIME`` in the Redis store).  The Lua scripts in ``lua/`` perform
exactly the same floating-point operations in the same order, so both stores
return identical decisions for identical inputs (``tests/limit/test_conformance.py``).

Common rules
------------
* ``cost`` is an int >= 0.  ``cost == 0`` is a free probe: allowed, state unchanged.
* A rejected request never changes the state (the function returns the *same*
  state object it was given) and never consumes quota.
* A cost larger than the most the algorithm can ever admit at once (bucket
  capacity, window limit) is always rejected with ``retry_after = inf``.
* ``retry_after`` (when rejected) is the time after which the same request is
  admitted if nothing else is admitted meanwhile.  It is computed in floating
  point, so retrying at exactly ``now + retry_after`` may land one ulp early;
  callers rounding up to whole seconds (``Retry-After``) are always safe.
* ``limit == 0`` denies every request of cost >= 1 (``retry_after = inf``).
* A clock that steps backwards is treated conservatively (state is never
  "refilled" by going back in time).

State records (kept tiny: the memory store holds one per key)
-------------------------------------------------------------
* token_bucket / leaky_bucket: one ``complex``: ``room + 1j * last update time``
  (room = tokens, or capacity - level) -- two doubles in one 32-byte object.
  Keeping the room itself (not a GCRA arrival time) keeps integer boundaries
  exact: a full bucket holds exactly ``capacity`` tokens and integer costs
  subtract exactly, so "20 requests at t=0" never turns into 19 through float
  rounding, and ``remaining`` is exact.
* fixed_window: one int, ``window_index << b | count`` with ``b =
  limit.bit_length()`` (a stored count never exceeds the limit): below 2**60,
  a 32-byte int, for limits up to 2**29 - 1 at period 1 s (window index 31 bits).
* sliding_window_counter: one int, ``window_index << 2b | previous << b | current``
  where ``b = limit.bit_length()`` (both counts are <= limit, see
  :func:`swc_pack`).  The field width follows the limit so that the int stays
  below 2**60 -- two 30-bit digits, a 32-byte object -- for the usual limits
  (window index at period 60 s: 25 bits, so limits up to 2**17 - 1 per minute;
  at period 1 s: 31 bits, limits up to 2**14 - 1 per second); a larger limit
  or a finer period just makes a wider (36-40 byte) int, never a wrong one.
  The window index is kept whole, not modulo anything: the memory store keeps
  a state until it is evicted, however long its key sleeps, so a wrapped index
  would read a state 2**k windows old as current.
* sliding_window_log: an ``array('d')`` of admitted timestamps, ascending, one
  entry per unit of cost.  This one is updated *in place* (copying it per call
  would cost O(limit)); expired entries are pruned on every call, which never
  changes a decision.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_right, insort
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ADMITTERS",
    "ALGORITHMS",
    "DECIDERS",
    "DENIED",
    "Decision",
    "Limit",
    "admit",
    "decide",
    "fixed_window",
    "is_idle",
    "leaky_bucket",
    "sliding_window_counter",
    "sliding_window_log",
    "swc_pack",
    "swc_unpack",
    "token_bucket",
]

ALGORITHMS = ("token_bucket", "leaky_bucket", "fixed_window", "sliding_window_log", "sliding_window_counter")

_MAX_COUNT = 0xFFFFFFFF  # counters are packed into 32-bit fields
_INF = math.inf
_J = 1j  # fill + _J * last == complex(fill, last), exactly, and faster to build
_floor = math.floor

_ABBREV = {
    "token_bucket": "tb",
    "leaky_bucket": "lb",
    "fixed_window": "fw",
    "sliding_window_log": "swl",
    "sliding_window_counter": "swc",
}

# Process-local short namespace ids: equal Limits (every field, name included)
# share one id, so the memory store keys state per (Limit, key) with a 2-4 byte
# prefix instead of a long one.  ``_LIMIT_BY_NS`` lets the store find the Limit
# of a stored entry to decide whether it is idle.
_NS_BY_SIG: dict[str, str] = {}
_LIMIT_BY_NS: dict[str, Limit] = {}


@dataclass(frozen=True, slots=True)
class _LimitFields:
    algorithm: str
    limit: int
    period: float
    burst: int | None = None
    delay: bool = False
    name: str = ""

    def __post_init__(self) -> None:  # overridden by Limit (the generated __init__ calls it)
        pass


class Limit(_LimitFields):
    """One rate limit rule: a frozen, slotted dataclass (fields: algorithm, limit,
    period, burst, delay, name).  Validated on construction (ValueError with the
    reason); ``period`` is normalised to float.

    ``burst`` is the token bucket capacity (default ``limit``) or the leaky bucket
    capacity = queue depth (default ``limit``); it is refused for the window
    algorithms.  ``delay`` (leaky bucket only) selects queue mode, see
    :func:`leaky_bucket`.  State is kept per (Limit, key): two Limits that differ
    in any field, ``name`` included, never share state, so changing a rule's
    parameters on reload starts it from fresh state instead of misreading old state.

    The derived values the hot path needs live in extra slots of this subclass,
    not in dataclass fields, so ``fields()`` / ``asdict()`` / ``replace()`` see
    only the six real fields.
    """

    __slots__ = ("_ns", "_sig", "_fn", "_admit", "_fw", "_bk", "_cap", "_rate", "_cb", "_cm")
    _ns: str  # process-local namespace id, e.g. "3:" (memory store)
    _sig: str  # stable text of every field (Redis key names)
    _fn: Callable[..., tuple[Decision, Any]]
    _admit: Callable[..., Any]
    _fw: bool  # fixed window with limit > 0 (MemoryStore.hit_sync inlines it)
    _bk: bool  # token or leaky bucket with limit > 0 (hit_sync inlines its admit path)
    _cap: int
    _rate: float
    _cb: int  # window algorithms: bits per count field (limit.bit_length())
    _cm: int  # the mask of one count field, (1 << _cb) - 1

    def __reduce__(self):
        return (Limit, (self.algorithm, self.limit, self.period, self.burst, self.delay, self.name))

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"unknown algorithm {self.algorithm!r}; expected one of {', '.join(ALGORITHMS)}")
        if isinstance(self.limit, bool) or not isinstance(self.limit, int):
            if isinstance(self.limit, float) and not isinstance(self.limit, bool) and self.limit.is_integer():
                object.__setattr__(self, "limit", int(self.limit))
            else:
                raise ValueError(f"limit must be an integer, got {self.limit!r}")
        if not 0 <= self.limit <= _MAX_COUNT:
            raise ValueError(f"limit must be between 0 and {_MAX_COUNT}, got {self.limit}")
        try:
            period = float(self.period)
        except (TypeError, ValueError):
            raise ValueError(f"period must be a number of seconds, got {self.period!r}") from None
        if not (period > 0 and math.isfinite(period)):
            raise ValueError(f"period must be a positive number of seconds, got {self.period!r}")
        object.__setattr__(self, "period", period)
        bucket = self.algorithm in ("token_bucket", "leaky_bucket")
        if self.burst is not None:
            if not bucket:
                raise ValueError(f"burst applies to token_bucket and leaky_bucket, not {self.algorithm}")
            if isinstance(self.burst, bool) or not isinstance(self.burst, int) or not 1 <= self.burst <= _MAX_COUNT:
                raise ValueError(f"burst must be an integer between 1 and {_MAX_COUNT}, got {self.burst!r}")
        if self.delay and self.algorithm != "leaky_bucket":
            raise ValueError("delay (queue mode) applies to leaky_bucket only")
        object.__setattr__(self, "delay", bool(self.delay))
        sig = (
            f"{self.name}|{_ABBREV[self.algorithm]}|{self.limit}/{period!r}"
            f"|b{'' if self.burst is None else self.burst}|{'q' if self.delay else 'm'}"
        )
        ns = _NS_BY_SIG.get(sig)
        if ns is None:
            ns = f"{len(_NS_BY_SIG):x}:"
            _NS_BY_SIG[sig] = ns
            _LIMIT_BY_NS[ns] = self
        object.__setattr__(self, "_sig", sig)
        object.__setattr__(self, "_ns", ns)
        # precomputed for the hot path (the Lua scripts compute the same values)
        cap = self.limit
        if bucket and self.limit:
            cap = self.limit if self.burst is None else self.burst
            if self.delay:
                cap += 1
        object.__setattr__(self, "_cap", cap)
        object.__setattr__(self, "_rate", self.limit / period)
        object.__setattr__(self, "_cb", self.limit.bit_length())
        object.__setattr__(self, "_cm", (1 << self._cb) - 1)
        fn: Callable[..., Any]
        adm: Callable[..., Any]
        if not self.limit:
            fn, adm = _deny_all_decider, _deny_all_admit
        elif self.algorithm == "sliding_window_counter":
            # per-limit closures: the constants are cell loads, not attribute lookups
            fn, adm = _swc_decider(self.limit, period, self._cb), _swc_admitter(self.limit, period, self._cb)
        elif bucket:
            # token_bucket / leaky_bucket minus their limit == 0 check (done above): one call less
            fn, adm = _bucket, ADMITTERS[self.algorithm]
        else:
            fn, adm = DECIDERS[self.algorithm], ADMITTERS[self.algorithm]
        object.__setattr__(self, "_fn", fn)
        object.__setattr__(self, "_admit", adm)
        object.__setattr__(self, "_fw", self.algorithm == "fixed_window" and self.limit > 0)
        object.__setattr__(self, "_bk", bucket and self.limit > 0)

    @property
    def capacity(self) -> int:
        """Most cost that can ever be admitted at once (reported as Decision.limit):
        burst for buckets (+1 in leaky queue mode), limit for windows, 0 if limit is 0."""
        return self._cap

    @property
    def rate(self) -> float:
        """Refill / outflow rate in units per second."""
        return self._rate


@dataclass(slots=True)
class Decision:
    allowed: bool
    limit: int  # quota reported to the client (capacity for buckets)
    remaining: int  # >= 0
    retry_after: float  # 0 when allowed; inf when the cost can never be admitted
    reset: float  # seconds until fully replenished (buckets, sliding) / window end (fixed)
    delay: float = 0.0  # leaky bucket queue mode: wait this long before forwarding


def _deny_all(cost: int) -> Decision:
    if cost == 0:
        return Decision(True, 0, 0, 0.0, 0.0)
    return Decision(False, 0, 0, _INF, 0.0)


def _deny_all_decider(limit: Limit, state: Any, now: float, cost: int = 1):
    return _deny_all(cost), state


# Hot-path note: ``_new(Decision)`` followed by six slot stores builds a Decision
# in about 60% of the time ``Decision(...)`` takes on CPython 3.11 (no __init__
# frame).  The allowed paths use it because that is most decisions, and so do
# the denied ones, because a key being limited (a client hammering) makes most
# of its decisions denials; only the rare cost-0 probes call Decision(...).
_new = object.__new__


# --------------------------------------------------------------------------- buckets
#
# Both buckets keep (free room, last update time) packed in one ``complex`` (two
# doubles in a 32-byte object; a 2-tuple of floats costs 104 bytes).  Keeping
# the room itself -- tokens for the token bucket, ``capacity - level`` for the
# leaky bucket -- rather than a GCRA arrival time or a rising water level keeps
# integer boundaries exact: a full bucket holds exactly ``cap`` tokens, and
# taking an integer cost away is exact in binary floating point, so
# ``remaining`` is always exactly the number of unit requests that still fit.
# (A leaky bucket as a meter is mathematically a token bucket.)


def _bucket(limit: Limit, state: complex | None, now: float, cost: int):
    cap = limit._cap
    rate = limit._rate
    if state is None:
        free: float = cap
        last = now
    else:
        free = state.real
        last = state.imag
        if now > last:
            free = free + (now - last) * rate
            if free > cap:
                free = cap
            last = now
    if cost > free:
        remaining = _floor(free)
        d = _new(Decision)
        d.allowed = False
        d.limit = cap
        d.remaining = remaining if remaining > 0 else 0
        d.retry_after = _INF if cost > cap else (cost - free) / rate
        d.reset = (cap - free) / rate
        d.delay = 0.0
        return d, state
    delay = (cap - free) / rate if limit.delay else 0.0
    if cost == 0:
        return Decision(True, cap, _floor(free), 0.0, (cap - free) / rate, delay), state
    free = free - cost
    d = _new(Decision)
    d.allowed = True
    d.limit = cap
    d.remaining = _floor(free)
    d.retry_after = 0.0
    d.reset = (cap - free) / rate
    d.delay = delay
    return d, free + _J * last


def token_bucket(limit: Limit, state: complex | None, now: float, cost: int = 1):
    """Token bucket: ``rate = limit/period`` tokens/s refill a bucket of ``burst``
    (default ``limit``) tokens; a request takes ``cost`` tokens or is rejected.

    State: ``complex(tokens, last_update)``.  Example: 10/s burst 20 -> 20
    allowed at t=0, the 21st is rejected with ``retry_after = 0.1``.
    ``remaining`` = whole tokens left, ``reset`` = time until the bucket is full.
    """
    if limit.limit == 0:
        return _deny_all(cost), state
    return _bucket(limit, state, now, cost)


def leaky_bucket(limit: Limit, state: complex | None, now: float, cost: int = 1):
    """Leaky bucket of ``capacity = burst or limit`` units draining at ``limit/period``/s.

    State: ``complex(capacity - level, last_update)`` (the room left, see above).

    Meter mode (``delay=False``): a request is admitted at once if it fits in the
    bucket, else rejected (mathematically a token bucket; ``reset`` = time until
    the bucket is empty).

    Queue mode (``delay=True``), like nginx ``limit_req burst=capacity`` without
    ``nodelay``: the water in the bucket is the queue; a request is admitted if at
    most ``capacity`` units wait ahead of it, and ``Decision.delay`` (= level /
    rate) tells the caller how long to hold it so that requests leave one slot
    (``period/limit``) apart.  So at an idle key ``capacity + 1`` requests are
    admitted at once (one immediately, ``capacity`` delayed), as in nginx;
    ``Decision.limit`` reports that ``capacity + 1``.
    """
    if limit.limit == 0:
        return _deny_all(cost), state
    return _bucket(limit, state, now, cost)


# --------------------------------------------------------------------------- windows


def fixed_window(limit: Limit, state: int | None, now: float, cost: int = 1):
    """Fixed window: at most ``limit`` per window ``[k*period, (k+1)*period)``
    (epoch-aligned, ``k = floor(now/period)``).  ``reset`` = time until the
    window ends; a rejected request's ``retry_after`` is the same.
    """
    lim = limit.limit
    period = limit.period
    w = _floor(now / period)
    count = 0
    b = limit._cb
    if state is not None:
        sw = state >> b
        if sw >= w:  # same window (or the clock stepped back: keep the later one)
            w = sw
            count = state & limit._cm
    reset = (w + 1) * period - now
    new = count + cost
    if new > lim:  # denied (the common case for a key being limited: built like the allowed one, below)
        d = _new(Decision)
        d.allowed = False
        d.limit = lim
        d.remaining = lim - count if count < lim else 0
        d.retry_after = _INF if cost > lim else reset
        d.reset = reset
        d.delay = 0.0
        return d, state
    if cost == 0:
        return Decision(True, lim, lim - new, 0.0, reset), state
    d = _new(Decision)
    d.allowed = True
    d.limit = lim
    d.remaining = lim - new
    d.retry_after = 0.0
    d.reset = reset
    d.delay = 0.0
    return d, (w << b) | new


def swc_pack(limit: Limit, window: int, previous: int, current: int) -> int:
    """The sliding window counter state of ``limit`` for (window index, previous
    window's count, current window's count): ``window << 2b | previous << b | current``
    with ``b = limit.limit.bit_length()``.  Counts must lie in ``[0, limit]`` (the
    algorithm never stores more: an admitted window never holds more than the
    limit), which is what lets ``b`` bits hold them; the window index is any int
    (negative ones too: shifts and masks of Python ints are two's complement)."""
    lim = limit.limit
    if not (0 <= previous <= lim and 0 <= current <= lim):
        raise ValueError(f"sliding window counts must be in [0, {lim}], got previous={previous} current={current}")
    b = limit._cb
    return (window << (b + b)) | (previous << b) | current


def swc_unpack(limit: Limit, state: int) -> tuple[int, int, int]:
    """``(window index, previous count, current count)`` of a state made by :func:`swc_pack`."""
    b = limit._cb
    mask = (1 << b) - 1
    return state >> (b + b), (state >> b) & mask, state & mask


# The sliding window counter's functions are made per Limit (``Limit._fn`` and
# ``Limit._admit``): limit, period and the field layout are closure constants.
#
# Which window the state is in, relative to ``w = floor(now / period)``, is
# decided without the floor: for an int ``sw`` and a float ``q = now / period``
# (the same division as the Lua script's), ``sw >= floor(q)`` <=> ``q < sw + 1``
# and ``sw == floor(q) - 1`` <=> ``sw + 1 <= q < sw + 2``; Python compares ints
# with floats exactly.  Only a state older than that (or none) needs the floor.
#
# With no previous count the estimate ``prev * (1 - elapsed/period) + n`` is
# ``±0.0 + n``, exactly ``n`` (elapsed/period is finite), so those paths compare
# ints; otherwise the float operations are the Lua script's, in the same order.


def _swc_decider(lim: int, period: float, bits: int):
    shift = bits + bits
    mask = (1 << bits) - 1

    def sliding_window_counter_decide(limit: Limit, state: int | None, now: float, cost: int = 1):
        q = now / period
        prev = 0
        curr = 0
        if state is None:
            w = _floor(q)
        else:
            sw = state >> shift
            if q < sw + 1:  # same window (or the clock stepped back: keep the later one)
                w = sw
                prev = (state >> bits) & mask
                curr = state & mask
            elif q < sw + 2:  # the state's window is the previous one
                w = sw + 1
                prev = state & mask
            else:
                w = _floor(q)
        ws = w * period
        elapsed = now - ws
        if elapsed < 0:
            elapsed = 0.0
        x = prev * (1 - elapsed / period)  # the previous window's weighted share
        # hold = the most units the current window may hold now: the largest integer
        # with x + hold <= lim, found with the same float comparison that admits, so
        # that ``remaining`` is exactly the number of unit requests that still fit.
        hold = _floor(lim - x)
        if x + (hold + 1) <= lim:
            hold += 1
        elif x + hold > lim:
            hold -= 1
        n = curr + cost
        if cost > lim or n > hold:  # i.e. x + curr + cost > lim
            if cost > lim:
                retry = _INF
            else:
                room = lim - cost - curr
                if room >= 0 and prev > 0:
                    t = ws + period * (1 - room / prev)
                else:
                    room = lim - cost
                    if curr <= room:
                        t = ws + period
                    else:
                        t = ws + period + period * (1 - room / curr)
                retry = t - now
                if retry < 0:
                    retry = 0.0
            if curr > 0:
                reset = (w + 2) * period - now
            elif prev > 0:
                reset = (w + 1) * period - now
            else:
                reset = 0.0
            d = _new(Decision)
            d.allowed = False
            d.limit = lim
            d.remaining = hold - curr if hold > curr else 0
            d.retry_after = retry
            d.reset = reset
            d.delay = 0.0
            return d, state
        if cost == 0:
            if curr > 0:
                reset = (w + 2) * period - now
            elif prev > 0:
                reset = (w + 1) * period - now
            else:
                reset = 0.0
            return Decision(True, lim, hold - n, 0.0, reset), state
        d = _new(Decision)
        d.allowed = True
        d.limit = lim
        d.remaining = hold - n
        d.retry_after = 0.0
        d.reset = (w + 2) * period - now
        d.delay = 0.0
        return d, (w << shift) | (prev << bits) | n

    return sliding_window_counter_decide


def _swc_admitter(lim: int, period: float, bits: int):
    shift = bits + bits
    mask = (1 << bits) - 1
    # horizon = (state, cost, t): that state stays denied for that cost at every
    # now <= t.  The estimate ``prev * (1 - elapsed/period) + n`` never grows with
    # ``now`` (each float operation in it is monotone, elapsed is clamped at 0), and
    # ``now / period < sw + 1`` holds for every now <= t once it holds at t, so one
    # denial verified at t covers every earlier instant: a client hammering a
    # limited key is turned away with three comparisons until t.  A decision is a
    # function of the state's value, cost and now only, so keys sharing a value
    # may share the horizon.  One tuple, read and replaced whole (threads).
    horizon: tuple[int | None, int, float] = (None, -1, -_INF)  # cost -1: matches nothing
    marked = None  # the last state denied (a hint only: when to look for its horizon)

    def remember(state: int, sw: int, prev: int, n: int, cost: int, now: float) -> None:
        # t: where the estimate reaches the limit (the real solution of
        # prev * (1 - e/period) + n = lim), at most the window's end, less a margin
        # for rounding; kept only if the admission comparison itself denies at t.
        nonlocal horizon
        ws = sw * period
        end = ws + period
        t = ws + period * (1 - (lim - n) / prev) if prev and n <= lim else end
        if t > end:
            t = end
        t -= period * 1e-9 + abs(t) * 2e-15
        if t <= now or not t / period < sw + 1:
            return
        if prev:
            e = t - ws
            if e < 0:
                e = 0.0
            if not prev * (1 - e / period) + n > lim:
                return
        elif not n > lim:
            return
        horizon = (state, cost, t)

    def sliding_window_counter_admit(limit: Limit, state: int | None, now: float, cost: int = 1):
        # ``x + n > lim`` is ``n > hold`` in the decider: hold is the largest
        # integer h with x + h <= lim, and x + h grows with h
        nonlocal marked
        h = horizon
        if state is h[0] and now <= h[2] and cost == h[1]:
            return DENIED
        q = now / period
        if state is not None:
            sw = state >> shift
            if q < sw + 1:  # same window (or the clock stepped back)
                n = (state & mask) + cost
                prev = (state >> bits) & mask
                if prev:
                    elapsed = now - sw * period
                    if elapsed < 0:
                        elapsed = 0.0
                    if cost > lim:
                        return DENIED
                    if prev * (1 - elapsed / period) + n > lim:
                        # the horizon is worth finding when the same state is
                        # denied twice in a row (one key hammered), not for a
                        # denial among many keys: the first one only marks it
                        if state is marked:
                            remember(state, sw, prev, n, cost, now)
                        else:
                            marked = state
                        return DENIED
                elif n > lim:
                    if state is marked:
                        if cost <= lim:
                            remember(state, sw, 0, n, cost, now)
                    else:
                        marked = state
                    return DENIED
                # n <= lim <= mask: adding cost to the current field never carries
                return state + cost
            if q < sw + 2:  # the state's window is the previous one
                w = sw + 1
                prev = state & mask
                if prev:
                    elapsed = now - w * period
                    if elapsed < 0:
                        elapsed = 0.0
                    if cost > lim or prev * (1 - elapsed / period) + cost > lim:
                        return DENIED
                elif cost > lim:
                    return DENIED
                if cost == 0:
                    return state
                return (w << shift) | (prev << bits) | cost
        # no state, or one older than the previous window: both counts are 0
        w = _floor(q)
        if cost > lim:
            return DENIED
        if cost == 0:
            return state
        return (w << shift) | cost

    return sliding_window_counter_admit


def sliding_window_counter(limit: Limit, state: int | None, now: float, cost: int = 1):
    """Sliding window counter (Cloudflare's approximation).

    Counts are kept for the current and the previous aligned window; the
    estimate is ``previous * (1 - elapsed/period) + current`` where ``elapsed`` is
    the time since the current window began.  A request is admitted if
    ``estimate + cost <= limit``; ``remaining`` = how many more unit requests
    would be admitted now (``floor(limit - estimate)``, exactly);
    ``reset`` = time until the estimate decays to zero; ``retry_after`` solves the
    linear decay for the moment the request fits.

    State: one int, see :func:`swc_pack`.  (The code is ``Limit._fn``, made per
    Limit by ``_swc_decider``.)
    """
    if limit.limit == 0:
        return _deny_all(cost), state
    return limit._fn(limit, state, now, cost)


def sliding_window_log(limit: Limit, state: Any, now: float, cost: int = 1):  # state: array('d') | None
    """Sliding window log: timestamps of admitted requests (one per unit of cost)
    in the last ``period``; never more than ``limit`` admitted in any half-open
    window ``(t - period, t]``.  An entry stamped ``t`` expires at ``t + period``.

    ``state`` is updated in place (see module doc).  ``retry_after`` is the time
    until enough of the oldest entries expire; ``reset`` the time until all do.

    Memory grows with the limit: up to ``limit`` entries per key (8 bytes each
    in the memory store; in Redis a sorted-set member ``<timestamp>:<n>`` of
    ~50 bytes while a key holds at most 128, Redis's default
    ``zset-max-listpack-entries``, ~120 bytes above), so for large limits
    prefer ``sliding_window_counter``.
    """
    lim = limit.limit
    if lim == 0:
        return _deny_all(cost), state
    period = limit.period
    if state:
        cutoff = now - period
        if state[0] <= cutoff:  # something expired (checking the oldest first skips the bisect)
            del state[: bisect_right(state, cutoff)]
        count = len(state)
    else:
        count = 0
    if cost > lim or count + cost > lim:
        retry = _INF if cost > lim else state[count + cost - lim - 1] + period - now
        reset = state[-1] + period - now if count else 0.0
        d = _new(Decision)
        d.allowed = False
        d.limit = lim
        d.remaining = lim - count if count < lim else 0
        d.retry_after = retry
        d.reset = reset
        d.delay = 0.0
        return d, state
    if cost == 0:
        reset = state[-1] + period - now if count else 0.0
        return Decision(True, lim, lim - count, 0.0, reset), state
    if state is None:
        state = array("d", (now,)) * cost
    elif state and now < state[-1]:  # clock stepped back: keep the log sorted
        for _ in range(cost):
            insort(state, now)
    elif cost == 1:
        state.append(now)
    else:
        state.extend(array("d", (now,)) * cost)
    d = _new(Decision)
    d.allowed = True
    d.limit = lim
    d.remaining = lim - count - cost
    d.retry_after = 0.0
    d.reset = state[-1] + period - now
    d.delay = 0.0
    return d, state


# --------------------------------------------------------------------------- dispatch

DECIDERS: dict[str, Callable[..., tuple[Decision, Any]]] = {
    "token_bucket": token_bucket,
    "leaky_bucket": leaky_bucket,
    "fixed_window": fixed_window,
    "sliding_window_log": sliding_window_log,
    "sliding_window_counter": sliding_window_counter,
}


# --------------------------------------------------------------------------- admission only
#
# ``admit(limit, state, now, cost)`` is ``decide`` for a caller that needs only
# "allowed?" (``MemoryStore.allow_sync``, the like of ``limits``' ``hit() -> bool``):
# the same comparisons and the same new state, without a Decision.  It returns
# the state to keep (possibly the same object, possibly None for a free probe
# of an unknown key) or ``DENIED``.  tests/bench/test_admit.py holds every
# admitter to its decider: same verdict, same state, on random event streams.

DENIED: Any = type("Denied", (), {"__repr__": lambda self: "DENIED", "__slots__": ()})()


def _deny_all_admit(limit: Limit, state: Any, now: float, cost: int = 1):
    return state if cost == 0 else DENIED


def _bucket_admit(limit: Limit, state: complex | None, now: float, cost: int = 1):
    cap = limit._cap
    if state is None:
        free: float = cap
        last = now
    else:
        free = state.real
        last = state.imag
        if now > last:
            free = free + (now - last) * limit._rate
            if free > cap:
                free = cap
            last = now
    if cost > free:
        return DENIED
    if cost == 0:
        return state
    return (free - cost) + _J * last


def _fixed_window_admit(limit: Limit, state: int | None, now: float, cost: int = 1):
    w = _floor(now / limit.period)
    count = 0
    if state is not None:
        sw = state >> limit._cb
        if sw >= w:
            w = sw
            count = state & limit._cm
    new = count + cost
    if new > limit.limit:
        return DENIED
    if cost == 0:
        return state
    return (w << limit._cb) | new


def _sliding_window_counter_admit(limit: Limit, state: int | None, now: float, cost: int = 1):
    return limit._admit(limit, state, now, cost)  # made per Limit by _swc_admitter


def _sliding_window_log_admit(limit: Limit, state: Any, now: float, cost: int = 1):  # state: array('d') | None
    lim = limit.limit
    if state:
        cutoff = now - limit.period
        if state[0] <= cutoff:
            del state[: bisect_right(state, cutoff)]
        count = len(state)
    else:
        count = 0
    if cost > lim or count + cost > lim:
        return DENIED
    if cost == 0:
        return state
    if state is None:
        return array("d", (now,)) * cost
    if state and now < state[-1]:
        for _ in range(cost):
            insort(state, now)
    elif cost == 1:
        state.append(now)
    else:
        state.extend(array("d", (now,)) * cost)
    return state


ADMITTERS: dict[str, Callable[..., Any]] = {
    "token_bucket": _bucket_admit,
    "leaky_bucket": _bucket_admit,
    "fixed_window": _fixed_window_admit,
    "sliding_window_log": _sliding_window_log_admit,
    "sliding_window_counter": _sliding_window_counter_admit,
}


def admit(limit: Limit, state: Any, now: float, cost: int = 1) -> Any:
    """``decide`` reduced to the verdict: the new state if admitted, else ``DENIED``."""
    if cost < 0:
        raise ValueError(f"cost must be >= 0, got {cost}")
    return limit._admit(limit, state, now, cost)


def decide(limit: Limit, state: Any, now: float, cost: int = 1) -> tuple[Decision, Any]:
    """Apply ``limit``'s algorithm: ``(Decision, new_state)``.  Pure except that the
    sliding log's array is updated in place (and returned)."""
    if cost < 0:
        raise ValueError(f"cost must be >= 0, got {cost}")
    return limit._fn(limit, state, now, cost)


def is_idle(limit: Limit, state: Any, now: float) -> bool:
    """True when ``state`` decides exactly like no state at all at ``now`` (and at
    any later time), so a store may forget it."""
    if state is None or limit.limit == 0:
        return True
    alg = limit.algorithm
    if alg == "token_bucket" or alg == "leaky_bucket":
        free = state.real
        last = state.imag
        if now > last:
            free = free + (now - last) * limit._rate
        return free >= limit._cap
    w = _floor(now / limit.period)
    if alg == "fixed_window":
        return (state >> limit._cb) < w
    if alg == "sliding_window_counter":
        sw, _, curr = swc_unpack(limit, state)
        return sw < w - 1 or (sw == w - 1 and curr == 0)
    return not state or state[-1] <= now - limit.period
