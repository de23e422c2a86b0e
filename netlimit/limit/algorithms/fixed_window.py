"""The fixed window counter."""

from __future__ import annotations

from typing import Any

from .base import _INF, Algorithm, Decision, Limit, _floor, _new, register


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


def is_idle(limit: Limit, state: Any, now: float) -> bool:
    return (state >> limit._cb) < _floor(now / limit.period)


ALGORITHM = register(
    Algorithm(
        "fixed_window",
        "fw",
        fixed_window,
        lambda limit: fixed_window,
        is_idle,
        lua="fixed_window.lua",
        lua_now_string=False,
    )
)
