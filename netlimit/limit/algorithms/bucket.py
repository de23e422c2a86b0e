"""The two buckets' shared arithmetic (token_bucket.py and leaky_bucket.py are
the documented entry points; one Lua script, ``bucket.lua``, serves both)."""

from __future__ import annotations

from typing import Any

from .base import _INF, _J, Decision, Limit, _floor, _new

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


def store_hit(limit: Limit, table: dict[str, Any], key: str, state: complex, now: float, cost: int) -> Decision:
    """:func:`_bucket` for a state the memory store holds: its admit path written
    out, the new state stored into ``table`` (no call, no tuple); the denial and
    cost-0 paths call :func:`_bucket` (Algorithm.store_hit)."""
    if cost:
        cap = limit._cap
        rate = limit._rate
        free = state.real
        last = state.imag
        if now > last:
            free = free + (now - last) * rate
            if free > cap:
                free = cap
            last = now
        if cost <= free:
            d = _new(Decision)
            d.allowed = True
            d.limit = cap
            d.retry_after = 0.0
            d.delay = (cap - free) / rate if limit.delay else 0.0
            free = free - cost
            d.remaining = _floor(free)
            d.reset = (cap - free) / rate
            table[key] = free + _J * last
            return d
    decision, new_state = _bucket(limit, state, now, cost)
    if new_state is not state:
        table[key] = new_state
    return decision


def is_idle(limit: Limit, state: Any, now: float) -> bool:
    free = state.real
    last = state.imag
    if now > last:
        free = free + (now - last) * limit._rate
    return free >= limit._cap


def decider(limit: Limit):
    """Token and leaky bucket minus their ``limit == 0`` check (a Limit with limit 0
    gets the deny-all decider instead): one call less per decision."""
    return _bucket
