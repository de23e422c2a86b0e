"""The sliding window log."""

from __future__ import annotations

from array import array
from bisect import bisect_right, insort
from typing import Any

from .base import _INF, Algorithm, Decision, Limit, _deny_all, _new, register


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


def is_idle(limit: Limit, state: Any, now: float) -> bool:
    return not state or state[-1] <= now - limit.period


ALGORITHM = register(
    Algorithm(
        "sliding_window_log",
        "swl",
        sliding_window_log,
        lambda limit: sliding_window_log,
        is_idle,
        lua="sliding_window_log.lua",
        lua_now_string=True,
    )
)
