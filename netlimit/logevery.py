"""At most one log line per key per interval: what hostile traffic can trigger
(bad requests, store failures, denials) must not grow the log with it."""

from __future__ import annotations

import time
from collections.abc import Callable


class LogEvery:
    """``due(key)`` is -1 when an event of ``key`` should not be logged now, else
    the number of events of that key held back since its last line."""

    __slots__ = ("interval", "clock", "_next", "_held")

    def __init__(self, interval: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.interval = interval
        self.clock = clock
        self._next: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def due(self, key: str) -> int:
        now = self.clock()
        if now < self._next.get(key, 0.0):
            self._held[key] = self._held.get(key, 0) + 1
            return -1
        if len(self._next) > 10_000:  # keys are rule paths or fixed names; bounded anyway
            self._next.clear()
            self._held.clear()
        self._next[key] = now + self.interval
        return self._held.pop(key, 0)
