"""The in-process store: bounded, one asyncio loop / thread, the default.

It runs the algorithms of :mod:`netlimit.limit.algorithms` directly and returns
the same :class:`Decision` objects the Redis store does for the same inputs
(``tests/limit/test_conformance.py`` holds them to that).
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable
from typing import Any

from ..algorithms import Decision, Limit, is_idle
from ..algorithms.base import _LIMIT_BY_NS
from .base import hash_key


class MemoryStore:
    """Bounded in-process store (one asyncio loop / thread; not thread-safe).

    Memory is bounded per limit (per rule), whatever clients send:

    * Each limit's states have a budget: ``max_keys`` unless :meth:`set_budgets`
      gives it one (the Limiter does: each rule's share of ``http.max_keys``, or
      its descriptor's own ``max_keys``).  A limit's new keys can only evict that
      limit's states -- junk keys under one rule never push out another rule's
      state (issue 29: a client over its /login limit got a fresh one after a
      few seconds of junk keys under another rule).
    * Eviction is a two-generation approximation of LRU, per limit: new and
      recently used states live in ``young`` (at most ``budget // 2``
      insertions); when it is full it becomes ``old`` and the previous ``old`` is
      dropped whole (counted in :attr:`evicted`, and ``on_evict`` is told).  A
      state used again while in ``old`` moves back to ``young``.  So any key used
      within the last ``budget // 2`` new keys of its limit is kept, and a hit
      costs one plain-dict lookup -- no reordering.  (An exact LRU ``OrderedDict``
      costs ~55 more bytes per key and a ``move_to_end`` per hit; this store stays
      under ~150 B/key including the key string, see the report in the tests.)
    * Idle states (ones that decide exactly like no state, ``algorithms.is_idle``)
      are equivalent to absent, so they are simply left to age out;
      :meth:`purge_idle` drops them all at once if wanted.
    * Keys longer than ``max_key_length`` are hashed (:func:`hash_key`).
    * ``clock`` gives "now" in seconds.  The default, ``time.time``, keeps fixed
      windows aligned to the epoch (minute windows start at :00) and agrees with
      Redis' ``TIME``; a clock that steps back is handled conservatively.
    """

    __slots__ = (
        "_young",
        "_old",
        "_n_young",
        "_young_cap",
        "_caps",
        "_budgets",
        "_max_keys",
        "_max_key_length",
        "_clock",
        "evictions",
        "evicted",
        "on_evict",
    )

    # Each generation is {limit namespace: {key: state}}: nesting instead of
    # concatenating "<ns><key>" saves an allocation and a hash per call and lets
    # a stored key share the caller's string.

    def __init__(
        self, max_keys: int = 100_000, max_key_length: int = 256, clock: Callable[[], float] = time.time
    ) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be >= 1")
        if max_key_length < 1:
            raise ValueError("max_key_length must be >= 1")
        self._young: dict[str, dict[str, Any]] = {}
        self._old: dict[str, dict[str, Any]] = {}
        #: per limit namespace: [insertions into its young generation since it was made,
        #: the young generation's size] (one list: one dict look-up per insertion)
        self._n_young: dict[str, list[int]] = {}
        #: the young generation's size of a limit without a budget of its own (0: a
        #: budget of 1, no old generation kept)
        self._young_cap = 0 if max_keys == 1 else max_keys // 2
        #: per limit namespace given a budget (set_budgets): its young generation's size,
        #: 0 when its budget is 1 (then it keeps no old generation)
        self._caps: dict[str, int] = {}
        self._budgets: dict[str, int] = {}
        self._max_keys = max_keys
        self._max_key_length = max_key_length
        self._clock = clock
        self.evictions = 0  # states dropped because their limit's budget was full
        #: the same per limit namespace
        self.evicted: dict[str, int] = {}
        #: called with (namespace, states dropped) at each eviction (it must be cheap)
        self.on_evict: Callable[[str, int], None] | None = None

    def set_budgets(self, budgets: dict[str, int], default: int | None = None) -> None:
        """Give limits their budgets: ``{limit namespace: most states}``;
        ``default`` is the budget of any other limit (None: ``max_keys``).  The
        states of limits that are neither given a budget nor dynamic (a rule
        removed or changed by a reload: no decision reaches them again) are dropped."""
        caps = {}
        for ns, n in budgets.items():
            if n < 1:
                raise ValueError(f"a budget must be >= 1, got {n}")
            caps[ns] = 0 if n == 1 else n // 2
        self._caps = caps
        self._budgets = dict(budgets)
        if default is not None:
            if default < 1:
                raise ValueError(f"a budget must be >= 1, got {default}")
            self._max_keys = default
            self._young_cap = 0 if default == 1 else default // 2
        for gen in (self._young, self._old):
            for ns in [ns for ns in gen if ns not in caps and not ns.startswith("~")]:
                del gen[ns]
                self._n_young.pop(ns, None)
        for ns, g in self._n_young.items():
            g[1] = caps.get(ns, self._young_cap)

    def budget(self, ns: str) -> int:
        """The most states a limit namespace keeps."""
        return self._budgets.get(ns, self._max_keys)

    def __len__(self) -> int:
        return sum(map(len, self._young.values())) + sum(map(len, self._old.values()))

    def __contains__(self, key: str) -> bool:
        """Whether some state is held for ``key`` (under any limit); for tests/ops."""
        if len(key) > self._max_key_length:
            key = hash_key(key)
        return any(key in t for gen in (self._young, self._old) for t in gen.values())

    def stored_keys(self) -> list[str]:
        """Every key (as stored: long ones hashed) holding state; for tests/ops."""
        return [k for gen in (self._young, self._old) for t in gen.values() for k in t]

    def _prepare(self, key: str, cost: int, now: float | None) -> tuple[str, float]:
        """The key as stored (long ones hashed) and the time of a call; a negative cost refused."""
        if now is None:
            now = self._clock()
        if len(key) > self._max_key_length:
            key = hash_key(key)
        if cost < 0:
            raise ValueError(f"cost must be >= 0, got {cost}")
        return key, now

    def hit_sync(self, key: str, limit: Limit, cost: int = 1, now: float | None = None) -> Decision:
        """Decide for ``key`` under ``limit`` and consume ``cost`` when allowed."""
        # _prepare, written out: a call and a tuple per decision show on this path
        if now is None:
            now = self._clock()
        if len(key) > self._max_key_length:
            key = hash_key(key)
        if cost < 0:
            raise ValueError(f"cost must be >= 0, got {cost}")
        table = self._young.get(limit._ns)
        if table is not None:
            state = table.get(key)
            if state is not None:
                hit = limit._hit
                if hit is not None:
                    # the algorithm's own in-place entry (Algorithm.store_hit): Lyft's fixed
                    # window and the buckets' admit path without a tuple per decision
                    return hit(limit, table, key, state, now, cost)
                decision, new_state = limit._fn(limit, state, now, cost)
                if new_state is not state:
                    table[key] = new_state
                return decision
        state = self._take_old(key, limit)
        decision, new_state = limit._fn(limit, state, now, cost)
        if new_state is not None:  # a new key, or one coming back from the old generation
            self._insert(key, limit, new_state, table)
        return decision

    def _take_old(self, key: str, limit: Limit) -> Any:
        """The state of ``key`` in the old generation, removed from it (or None)."""
        if self._old:
            old = self._old.get(limit._ns)
            if old:
                return old.pop(key, None)
        return None

    def _insert(self, key: str, limit: Limit, state: Any, table: dict[str, Any] | None) -> None:
        """Store a state that is not in the young generation (``table`` is the
        limit's young table, or None if it has none yet).  Only this limit's own
        states can be evicted to make room."""
        ns = limit._ns
        g = self._n_young.get(ns)
        if g is None:
            g = self._n_young[ns] = [0, self._caps.get(ns, self._young_cap)]
        if g[0] >= g[1]:
            self._rotate(ns, g[1] > 0)
            table = None
            g[0] = 0
        if table is None:
            table = self._young.setdefault(ns, {})
        table[key] = state
        g[0] += 1

    def peek_sync(self, key: str, limit: Limit, cost: int = 1, now: float | None = None) -> Decision:
        """The decision ``hit_sync`` would return, without changing anything."""
        key, now = self._prepare(key, cost, now)
        state = self._young.get(limit._ns, {}).get(key)
        if state is None:
            state = self._old.get(limit._ns, {}).get(key)
        if isinstance(state, array):  # the sliding log updates its array in place
            state = array("d", state)
        return limit._fn(limit, state, now, cost)[0]

    async def hit(self, key: str, limit: Limit, cost: int = 1, *, now: float | None = None) -> Decision:
        return self.hit_sync(key, limit, cost, now)

    async def peek(self, key: str, limit: Limit, cost: int = 1, *, now: float | None = None) -> Decision:
        return self.peek_sync(key, limit, cost, now)

    async def close(self) -> None:
        self.clear()

    def clear(self) -> None:
        self._young = {}
        self._old = {}
        self._n_young = {}

    def purge_idle(self, now: float | None = None) -> int:
        """Drop every idle state (O(n)); returns how many were dropped."""
        if now is None:
            now = self._clock()
        dropped = 0
        for gen in (self._young, self._old):
            for ns, table in gen.items():
                limit = _LIMIT_BY_NS.get(ns)
                if limit is None:  # DynamicLimits' shared table: aged out by eviction only
                    continue
                idle = [k for k, state in table.items() if is_idle(limit, state, now)]
                for k in idle:
                    del table[k]
                dropped += len(idle)
                g = self._n_young.get(ns) if gen is self._young else None
                if g is not None:
                    g[0] -= len(idle)
        return dropped

    def _rotate(self, ns: str, keep_old: bool) -> None:
        """One limit's young generation is full: it becomes its old one, and the
        previous old one is dropped (all of the young one too for a budget of 1)."""
        young = self._young.pop(ns, None)
        old = self._old.pop(ns, None)
        dropped = len(old) if old else 0
        if keep_old:
            if young:
                self._old[ns] = young
        elif young:
            dropped += len(young)
        if dropped:
            self.evictions += dropped
            self.evicted[ns] = self.evicted.get(ns, 0) + dropped
            if self.on_evict is not None:
                self.on_evict(ns, dropped)
