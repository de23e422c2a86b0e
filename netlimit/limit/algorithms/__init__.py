"""The L7 rate-limit algorithms (five, the fixed window in two countings) as
small pure functions, and their registry.

One module per algorithm (its decide function, its state packing, its Lua
script's name, the memory store's in-place ``store_hit``), which registers an
:class:`Algorithm`; :mod:`.base` holds what they share.  This package is the
only place that names them: the config (``algorithm:``), the stores, simulate
and the benches read :data:`REGISTRY`, :data:`CONFIG_ALGORITHMS` and the
constants below (tests/test_architecture.py holds them to it).  Every algorithm has the
shape ``f(limit, state, now, cost) -> (Decision, new_state)``.  ``state`` is
``None`` for a key never seen (or forgotten); ``now`` is the caller's clock in
seconds (injected in tests; ``time.time()`` in the memory store, the Redis
server's ``TIME`` in the Redis store).  The Lua scripts in
``netlimit/limit/stores/lua/`` perform exactly the same floating-point
operations in the same order, so both stores return identical decisions for
identical inputs (``tests/limit/test_conformance.py``).

Common rules
------------
* ``cost`` is an int >= 0.  ``cost == 0`` is a free probe: allowed (unless the
  window is already over its limit, in ``fixed_window``), state unchanged.
* A rejected request never changes the state (the function returns the *same*
  state object it was given) and never consumes quota -- except in
  ``fixed_window``, which counts every request as envoyproxy/ratelimit does
  (``Algorithm.counts_denied``; ``fixed_window_admitted`` is the same window
  following this rule).
* A cost larger than the most the algorithm can ever admit at once (bucket
  capacity, window limit) is always rejected with ``retry_after = inf``.
* ``retry_after`` (when rejected) is the time after which the same request is
  admitted if nothing else is admitted meanwhile.  It is computed in floating
  point, so retrying at exactly ``now + retry_after`` may land one ulp early;
  callers rounding up to whole seconds (``Retry-After``) are always safe.
* ``limit == 0`` denies every request of cost >= 1 (``retry_after = inf``);
  ``fixed_window`` also reports its window's ``reset`` and counts the hits.
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
* fixed_window / fixed_window_admitted: one int, ``window_index << b | count``
  with ``b = (limit + 1).bit_length()`` (the count saturates at ``limit + 1``)
  / ``limit.bit_length()`` (a stored count never exceeds the limit): below
  2**60, a 32-byte int, for limits up to 2**29 - 2 at period 1 s (window index
  31 bits).
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

from typing import Any

from . import fixed_window as _fixed_window_module
from . import leaky_bucket as _leaky_bucket_module
from . import sliding_window_counter as _swc_module
from . import sliding_window_log as _swl_module
from . import token_bucket as _token_bucket_module
from .base import REGISTRY, Algorithm, Decision, DynamicLimit, Limit
from .fixed_window import fixed_window, fixed_window_admitted
from .leaky_bucket import leaky_bucket
from .sliding_window_counter import sliding_window_counter, swc_pack, swc_unpack
from .sliding_window_log import sliding_window_log
from .token_bucket import token_bucket

__all__ = [
    "ALGORITHMS",
    "CONFIG_ALGORITHMS",
    "DECIDERS",
    "DEFAULT_ALGORITHM",
    "FIXED_WINDOW",
    "FIXED_WINDOW_ADMITTED",
    "LEAKY_BUCKET",
    "REGISTRY",
    "SLIDING_WINDOW_COUNTER",
    "SLIDING_WINDOW_LOG",
    "TOKEN_BUCKET",
    "Algorithm",
    "Decision",
    "DynamicLimit",
    "Limit",
    "decide",
    "fixed_window",
    "fixed_window_admitted",
    "is_idle",
    "leaky_bucket",
    "sliding_window_counter",
    "sliding_window_log",
    "swc_pack",
    "swc_unpack",
    "token_bucket",
]

# The registry: the one place that lists the algorithms (each module registered
# itself on import), in the order messages, the schema and the reports list them.
_ORDER = (
    _token_bucket_module.ALGORITHM,
    _leaky_bucket_module.ALGORITHM,
    _fixed_window_module.ALGORITHM,
    _fixed_window_module.ADMITTED,
    _swl_module.ALGORITHM,
    _swc_module.ALGORITHM,
)
assert {a.name for a in _ORDER} == set(REGISTRY), sorted(REGISTRY)  # a registered algorithm is listed here
REGISTRY.clear()
REGISTRY.update((a.name, a) for a in _ORDER)

#: every algorithm the engine runs (fixed_window_admitted included)
ALGORITHMS = tuple(REGISTRY)
#: the ones a file names (``algorithm:``), in the schema's order
CONFIG_ALGORITHMS = tuple(n for n, a in REGISTRY.items() if a.configurable)
#: a descriptor without ``algorithm:`` (Lyft's fixed window)
(DEFAULT_ALGORITHM,) = (n for n, a in REGISTRY.items() if a.default)
#: the names, for the code that picks one (bans, suggestions, benches)
TOKEN_BUCKET = _token_bucket_module.ALGORITHM.name
LEAKY_BUCKET = _leaky_bucket_module.ALGORITHM.name
FIXED_WINDOW = _fixed_window_module.ALGORITHM.name
FIXED_WINDOW_ADMITTED = _fixed_window_module.ADMITTED.name
SLIDING_WINDOW_LOG = _swl_module.ALGORITHM.name
SLIDING_WINDOW_COUNTER = _swc_module.ALGORITHM.name

#: name -> the documented pure function
DECIDERS = {name: REGISTRY[name].decide for name in ALGORITHMS}


def decide(limit: Limit, state: Any, now: float, cost: int = 1) -> tuple[Decision, Any]:
    """Apply ``limit``'s algorithm: ``(Decision, new_state)``.  Pure except that the
    sliding log's array is updated in place (and returned)."""
    if cost < 0:
        raise ValueError(f"cost must be >= 0, got {cost}")
    return limit._fn(limit, state, now, cost)


def is_idle(limit: Limit, state: Any, now: float) -> bool:
    """True when ``state`` decides exactly like no state at all at ``now`` (and at
    any later time), so a store may forget it."""
    if state is None or limit._deny0:
        return True
    return REGISTRY[limit.algorithm].is_idle(limit, state, now)
