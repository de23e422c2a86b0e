"""What every algorithm shares: the :class:`Limit` a rule compiles to, the
:class:`Decision` an algorithm answers, and the registry each algorithm module
adds itself to (:class:`Algorithm`: its decide function, its idle test, its Lua
script).  The rules every algorithm follows are in the package's docstring.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_MAX_COUNT = 0xFFFFFFFF  # counters are packed into 32-bit fields
_INF = math.inf
_J = 1j  # fill + _J * last == complex(fill, last), exactly, and faster to build
_floor = math.floor


@dataclass(frozen=True)
class Algorithm:
    """One algorithm as the rest of the engine sees it."""

    name: str
    #: in state signatures (and so in Redis key names): never change one
    abbrev: str
    #: the documented pure function ``(limit, state, now, cost) -> (Decision, state)``
    decide: Callable[..., tuple[Decision, Any]]
    #: the function a Limit calls (``Limit._fn``): ``decide`` itself, or one made per
    #: Limit with its constants in a closure
    decider: Callable[[Limit], Callable[..., tuple[Decision, Any]]]
    #: ``(limit, state, now) -> bool``: the state decides exactly like no state, now
    #: and later, so a store may forget it
    is_idle: Callable[[Limit, Any, float], bool]
    #: its script in netlimit/limit/stores/lua/, run after _prelude.lua
    lua: str
    #: the script stores or scores ``now`` as text (TIME is read as a decimal string)
    lua_now_string: bool
    #: capacity is ``burst`` (token and leaky bucket); burst (and delay) allowed
    bucket: bool = False
    #: a denied request is counted too (Lyft's fixed window): a denial may change
    #: the state, and a limit of 0 is decided by the algorithm (with a state: a
    #: probe after a denied hit is denied), not answered without one
    counts_denied: bool = False
    #: a file can name it (``algorithm:``); False for an engine-internal variant
    configurable: bool = True
    #: the default of a descriptor without ``algorithm:`` (exactly one: Lyft's fixed window)
    default: bool = False
    #: ``delay: true`` (queue mode) is allowed (the leaky bucket)
    queue: bool = False
    #: the variant that counts admitted requests only (``count_denied: false``), if any
    admitted: str = ""
    #: the memory store's call for a state it holds: ``(limit, table, key, state, now,
    #: cost) -> Decision``, writing the new state into ``table`` itself (no tuple per
    #: decision); None: the store calls the decide function and stores its new state
    store_hit: Callable[..., Decision] | None = None


#: name -> Algorithm; each algorithm module registers itself on import (the
#: package imports them all before anything can build a Limit)
REGISTRY: dict[str, Algorithm] = {}


def register(alg: Algorithm) -> Algorithm:
    REGISTRY[alg.name] = alg
    return alg


def _names(flag: str) -> str:
    """The registered algorithms with ``flag`` set, for messages ("a and b")."""
    return " and ".join(n for n, a in REGISTRY.items() if getattr(a, flag))


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

    __slots__ = ("_ns", "_sig", "_fn", "_hit", "_deny0", "_cap", "_rate", "_cb", "_cm")
    _ns: str  # process-local namespace id, e.g. "3:" (memory store)
    _sig: str  # stable text of every field (Redis key names)
    _fn: Callable[..., tuple[Decision, Any]]
    _hit: Callable[..., Decision] | None  # the memory store's call for a held state (Algorithm.store_hit)
    _deny0: bool  # limit 0 decided without a state: every cost >= 1 denied, a probe allowed
    _cap: int
    _rate: float
    _cb: int  # window algorithms: bits per count field (limit.bit_length(); (limit + 1) for fixed_window)
    _cm: int  # the mask of one count field, (1 << _cb) - 1

    #: a limit made from request data (a limit override): see :class:`DynamicLimit`
    _dynamic = False

    def __reduce__(self):
        return (type(self), (self.algorithm, self.limit, self.period, self.burst, self.delay, self.name))

    def __post_init__(self) -> None:
        if self.algorithm not in REGISTRY:
            raise ValueError(f"unknown algorithm {self.algorithm!r}; expected one of {', '.join(REGISTRY)}")
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
        bucket = REGISTRY[self.algorithm].bucket
        if self.burst is not None:
            if not bucket:
                raise ValueError(f"burst applies to {_names('bucket')}, not {self.algorithm}")
            if isinstance(self.burst, bool) or not isinstance(self.burst, int) or not 1 <= self.burst <= _MAX_COUNT:
                raise ValueError(f"burst must be an integer between 1 and {_MAX_COUNT}, got {self.burst!r}")
        if self.delay and not REGISTRY[self.algorithm].queue:
            raise ValueError(f"delay (queue mode) applies to {_names('queue')} only")
        object.__setattr__(self, "delay", bool(self.delay))
        alg = REGISTRY[self.algorithm]
        sig = (
            f"{self.name}|{alg.abbrev}|{self.limit}/{period!r}"
            f"|b{'' if self.burst is None else self.burst}|{'q' if self.delay else 'm'}"
        )
        if self._dynamic:
            # not registered: one namespace per algorithm (and queue mode) for all of them
            ns = f"~{alg.abbrev}{'q' if self.delay else 'm'}:"
        else:
            known = _NS_BY_SIG.get(sig)
            if known is None:
                ns = f"{len(_NS_BY_SIG):x}:"
                _NS_BY_SIG[sig] = ns
                _LIMIT_BY_NS[ns] = self
            else:
                ns = known
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
        # a count saturated at limit + 1 (counts_denied) needs one more value
        object.__setattr__(self, "_cb", (self.limit + alg.counts_denied).bit_length())
        object.__setattr__(self, "_cm", (1 << self._cb) - 1)
        deny0 = self.limit == 0 and not alg.counts_denied
        fn = _deny_all_decider if deny0 else alg.decider(self)
        object.__setattr__(self, "_fn", fn)
        object.__setattr__(self, "_deny0", deny0)
        object.__setattr__(self, "_hit", None if deny0 else alg.store_hit)

    @property
    def capacity(self) -> int:
        """Most cost that can ever be admitted at once (reported as Decision.limit):
        burst for buckets (+1 in leaky queue mode), limit for windows, 0 if limit is 0."""
        return self._cap

    @property
    def rate(self) -> float:
        """Refill / outflow rate in units per second."""
        return self._rate


class DynamicLimit(Limit):
    """A Limit made from request data (a descriptor's limit override), of which a
    client can make any number: nothing is kept per instance outside it.  It is
    not registered (no namespace id of its own, nothing in ``_LIMIT_BY_NS``):
    every DynamicLimit of an algorithm (and queue mode) shares one namespace,
    ``~<abbrev><q|m>:``, so the memory store keeps their states in one table and
    the caller must make each one's keys its own (the override's store keys
    carry its numbers, limiter.override_rule).  The Redis store runs them with
    one script per algorithm that takes the numbers as arguments
    (stores/redis.py), not one compiled script per limit."""

    __slots__ = ()
    _dynamic = True


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
