"""The fixed window counter, in two countings.

``fixed_window`` counts as envoyproxy/ratelimit (Lyft) does: every request's
cost is added to its window, admitted or not (Lyft's ``INCRBY`` comes before the
comparison), and a request is over the limit when the window's count after it
exceeds the limit.  So a client that keeps asking while over the limit stays
over until the window ends, a free probe (cost 0) after a denied request is
itself denied, and a large cost that is denied still uses up the window.

``fixed_window_admitted`` is netlimit's earlier counting (the descriptor option
``count_denied: false``): only admitted requests count, so a denied request
leaves the window as it was and a smaller one may still pass.

State, both: one int, ``window_index << b | count``.  For ``fixed_window`` the
count saturates at ``limit + 1`` (every count above the limit decides alike:
over, remaining 0) and ``b = (limit + 1).bit_length()``; for
``fixed_window_admitted`` the count never exceeds the limit and ``b =
limit.bit_length()``.  Either way the int stays below 2**60 for the usual
limits (tests/limit/test_fw_state.py).
"""

from __future__ import annotations

from typing import Any

from .base import _INF, Algorithm, Decision, Limit, _floor, _new, register


def fixed_window(limit: Limit, state: int | None, now: float, cost: int = 1):
    """Lyft's fixed window: windows ``[k*period, (k+1)*period)`` (epoch-aligned,
    ``k = floor(now/period)``); every call adds ``cost`` to its window's count
    (stored saturated at ``limit + 1``), and is allowed when the count after it
    is at most ``limit``.  ``remaining`` = ``limit - count`` when allowed, else
    0; ``reset`` = time until the window ends, also for a limit of 0.  A denied
    request's ``retry_after`` is ``reset`` (the next window starts empty), or
    inf when ``cost`` exceeds the limit.
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
    if new > lim:  # over: the hits count all the same (saturated at lim + 1)
        d = _new(Decision)
        d.allowed = False
        d.limit = lim
        d.remaining = 0
        d.retry_after = _INF if cost > lim else reset
        d.reset = reset
        d.delay = 0.0
        if count > lim:  # already saturated in this window
            return d, state
        return d, (w << b) | (lim + 1)
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


def fixed_window_admitted(limit: Limit, state: int | None, now: float, cost: int = 1):
    """netlimit's fixed window: at most ``limit`` admitted per window; a rejected
    request changes nothing (its ``remaining`` is what is left of the window).
    ``reset`` = time until the window ends; a rejected request's ``retry_after``
    is the same (inf when ``cost`` exceeds the limit).
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


def store_hit(limit: Limit, table: dict[str, Any], key: str, state: int, now: float, cost: int) -> Decision:
    """:func:`fixed_window` for a state the memory store holds (Lyft's default, the
    most used): the same operations, the new state written into ``table`` instead of
    returned (no tuple per decision; Algorithm.store_hit)."""
    lim = limit.limit
    period = limit.period
    w = _floor(now / period)
    b = limit._cb
    sw = state >> b
    if sw >= w:
        w = sw
        count = state & limit._cm
    else:
        count = 0
    new = count + cost
    reset = (w + 1) * period - now
    d = _new(Decision)
    d.limit = lim
    d.reset = reset
    d.delay = 0.0
    if new > lim:
        d.allowed = False
        d.remaining = 0
        d.retry_after = _INF if cost > lim else reset
        if count <= lim:  # the hits count: saturate at lim + 1 (once per window)
            table[key] = (w << b) | (lim + 1)
        return d
    if cost:
        table[key] = (w << b) | new
    d.allowed = True
    d.remaining = lim - new
    d.retry_after = 0.0
    return d


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
        counts_denied=True,
        default=True,
        admitted="fixed_window_admitted",
        store_hit=store_hit,
    )
)
ADMITTED = register(
    Algorithm(
        "fixed_window_admitted",
        "fa",
        fixed_window_admitted,
        lambda limit: fixed_window_admitted,
        is_idle,
        lua="fixed_window_admitted.lua",
        lua_now_string=False,
        configurable=False,  # a file says fixed_window with count_denied: false
    )
)
