"""The sliding window counter (Cloudflare's approximation), with its packed state."""

from __future__ import annotations

from typing import Any

from .base import _INF, Algorithm, Decision, Limit, _deny_all, _floor, _new, register


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
# made per Limit): limit, period and the field layout are closure constants.
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


def decider(limit: Limit):
    """The decide function of one Limit: limit, period and field widths as closure constants."""
    return _swc_decider(limit.limit, limit.period, limit._cb)


def is_idle(limit: Limit, state: Any, now: float) -> bool:
    w = _floor(now / limit.period)
    sw, _, curr = swc_unpack(limit, state)
    return sw < w - 1 or (sw == w - 1 and curr == 0)


ALGORITHM = register(
    Algorithm(
        "sliding_window_counter",
        "swc",
        sliding_window_counter,
        decider,
        is_idle,
        lua="sliding_window_counter.lua",
        lua_now_string=False,
    )
)
