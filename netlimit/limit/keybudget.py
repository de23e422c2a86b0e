"""A rule's key budget on the shared store (issue 29, item 9).

In the memory store a rule's ``max_keys`` bounds the states it keeps (its
generations evict its own least recently used keys).  Redis cannot evict per
rule, and one client made 131k keys (58 MB) in 15 s under a per-day rule.  So a
rule with its own ``max_keys`` is also bounded on Redis, by the sidecar that
writes: at most ``max_keys`` **new** keys per period of the rule (the keys a
period can keep alive: every Redis key of the rule expires a period after its
last write).  A key beyond that is not sent to Redis: it is decided as
``on_store_failure`` says (``local``: the local memory store, itself within the
rule's memory budget) and counted.  Keys already written in this period or the
previous one keep going to Redis.

The bound is per sidecar: N sidecars write at most N x ``max_keys`` new keys per
period under the rule.  Memory: at most two periods' key sets of ``max_keys``
strings each.
"""

from __future__ import annotations

import math


class KeyBudget:
    """The new keys one rule may write to the shared store per period."""

    __slots__ = ("max_keys", "period", "window", "cur", "prev")

    def __init__(self, max_keys: int, period: float) -> None:
        if max_keys < 1:
            raise ValueError(f"max_keys must be >= 1, got {max_keys}")
        self.max_keys = max_keys
        self.period = float(period)
        self.window = -1
        self.cur: set[str] = set()  # keys written in this period
        self.prev: set[str] = set()  # ... and in the previous one (still alive in Redis)

    def admit(self, key: str, now: float) -> bool:
        """Whether ``key`` may go to the shared store now (True also records it)."""
        w = math.floor(now / self.period)
        if w != self.window:
            self.prev = self.cur if w == self.window + 1 else set()
            self.cur = set()
            self.window = w
        cur = self.cur
        if key in cur:
            return True
        if len(cur) < self.max_keys:
            cur.add(key)
            return True
        return key in self.prev
