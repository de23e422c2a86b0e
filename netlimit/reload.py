"""The reload policy netlimitd and the sidecar share.

A reload keeps the running config on any problem (the caller logs every
FILE:LINE:COL problem and records the rejection for status and metrics).
One more case deserves distrust although the file is valid: a new file that
would remove MOST of a running config's rules (more than half of them, by
name) -- most often a file caught while it is being rewritten, or truncated by
mistake, whose first rules parse.  :class:`DropGuard` holds such a file back
until it has stayed the same for ``settle`` seconds; the caller checks again
then (a timer), and a file that is still the same is accepted, loudly.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection


class DropGuard:
    """Say whether a valid new config may replace the running one now."""

    def __init__(self, settle: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self.settle = settle
        self.clock = clock
        self._held: tuple[str, float] | None = None  # (sha256 of the held file, first seen)

    @staticmethod
    def removed(new: Collection[str], running: Collection[str]) -> int:
        """How many of the running rules (by name) the new config no longer has."""
        keep = set(new)
        return sum(1 for name in set(running) if name not in keep)

    @classmethod
    def suspicious(cls, new: Collection[str], running: Collection[str]) -> bool:
        """True when the new config removes more than half of the running rules."""
        n = len(set(running))
        return n > 0 and 2 * cls.removed(new, running) > n

    def check(self, sha256: str, new: Collection[str], running: Collection[str]) -> float:
        """0 to accept now; else how many seconds to wait before checking again.
        ``new`` and ``running`` are the rule names of the new and the running config."""
        if not self.suspicious(new, running):
            self._held = None
            return 0.0
        now = self.clock()
        if self._held is None or self._held[0] != sha256:
            self._held = (sha256, now)
            return self.settle
        left = self._held[1] + self.settle - now
        if left > 0:
            return left
        self._held = None
        return 0.0

    @property
    def holding(self) -> bool:
        return self._held is not None
