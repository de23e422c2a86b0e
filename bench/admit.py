"""Admission-only twins of the algorithms, for the in-process benchmark's
like-for-like row: ``limits``' ``hit()`` answers a bool, so this measures the same
comparisons and state changes as :mod:`netlimit.limit.algorithms` without building
a Decision.  The product never calls these (the sidecar needs the Decision for
its headers); they live here, held to the deciders by tests/bench/test_admit.py.

``admit(limit, state, now, cost)`` returns the state to keep (possibly the same
object, possibly None for a free probe of an unknown key) or ``DENIED``, or,
for a denial that changes the state (``fixed_window`` counts denied hits),
``DeniedTo(state)``; :func:`allow_sync` is ``MemoryStore.hit_sync`` reduced to
the verdict.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right, insort
from collections.abc import Callable
from typing import Any

from netlimit.limit.algorithms import (
    FIXED_WINDOW,
    FIXED_WINDOW_ADMITTED,
    LEAKY_BUCKET,
    SLIDING_WINDOW_COUNTER,
    SLIDING_WINDOW_LOG,
    TOKEN_BUCKET,
)
from netlimit.limit.algorithms.base import _INF, _J, Limit, _floor
from netlimit.limit.stores.base import hash_key
from netlimit.limit.stores.memory import MemoryStore

DENIED: Any = type("Denied", (), {"__repr__": lambda self: "DENIED", "__slots__": ()})()


class DeniedTo:
    """A denial that leaves ``state`` behind (Lyft's fixed window counting the hits)."""

    __slots__ = ("state",)

    def __init__(self, state: Any) -> None:
        self.state = state


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
    lim = limit.limit
    if new > lim:
        # the hits count (saturated at lim + 1): the state changes once per window
        return DENIED if count > lim else DeniedTo((w << limit._cb) | (lim + 1))
    if cost == 0:
        return state
    return (w << limit._cb) | new


def _fixed_window_admitted_admit(limit: Limit, state: int | None, now: float, cost: int = 1):
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
    return _swc_admit_of(limit)(limit, state, now, cost)  # made per Limit by _swc_admitter


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
    TOKEN_BUCKET: _bucket_admit,
    LEAKY_BUCKET: _bucket_admit,
    FIXED_WINDOW: _fixed_window_admit,
    FIXED_WINDOW_ADMITTED: _fixed_window_admitted_admit,
    SLIDING_WINDOW_LOG: _sliding_window_log_admit,
    SLIDING_WINDOW_COUNTER: _sliding_window_counter_admit,
}


def admit(limit: Limit, state: Any, now: float, cost: int = 1) -> Any:
    """``decide`` reduced to the verdict: the new state if admitted, else ``DENIED``."""
    if cost < 0:
        raise ValueError(f"cost must be >= 0, got {cost}")
    return _admitter(limit)(limit, state, now, cost)


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


_SWC_ADMITTERS: dict[str, Callable[..., Any]] = {}


def _swc_admit_of(limit: Limit) -> Callable[..., Any]:
    fn = _SWC_ADMITTERS.get(limit._ns)
    if fn is None:
        fn = _SWC_ADMITTERS[limit._ns] = _swc_admitter(limit.limit, limit.period, limit._cb)
    return fn


def _admitter(limit: Limit) -> Callable[..., Any]:
    if limit._deny0:
        return _deny_all_admit
    if limit.algorithm == SLIDING_WINDOW_COUNTER:
        return _swc_admit_of(limit)
    return ADMITTERS[limit.algorithm]


def allow_fn(store: MemoryStore, limit: Limit) -> Callable[..., bool]:
    """``store.hit_sync(key, limit, cost, now)`` reduced to the verdict, as a function
    of ``(key, cost=1, now=None)`` with the admitter bound once: the same state change,
    True when admitted."""
    adm = _admitter(limit)
    ns = limit._ns
    clock = store._clock
    max_len = store._max_key_length

    def allow_sync(key: str, cost: int = 1, now: float | None = None) -> bool:
        if now is None:
            now = clock()
        if len(key) > max_len:
            key = hash_key(key)
        if cost < 0:
            raise ValueError(f"cost must be >= 0, got {cost}")
        table = store._young.get(ns)
        if table is not None:
            state = table.get(key)
            if state is not None:
                new_state = adm(limit, state, now, cost)
                if new_state is DENIED:
                    return False
                if new_state.__class__ is DeniedTo:
                    table[key] = new_state.state
                    return False
                if new_state is not state:
                    table[key] = new_state
                return True
        state = store._take_old(key, limit)
        new_state = adm(limit, state, now, cost)
        allowed = new_state is not DENIED and new_state.__class__ is not DeniedTo
        if new_state is DENIED:
            new_state = state
        elif not allowed:
            new_state = new_state.state
        if new_state is not None:
            store._insert(key, limit, new_state, table)
        return allowed

    return allow_sync
