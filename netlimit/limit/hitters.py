"""The most denied clients, in bounded memory (the Space-Saving algorithm of
Metwally, Agrawal and El Abbadi, 2005): `capacity` counters; a new key, when all
are taken, replaces the smallest and inherits its count, so a heavy hitter is never
missed and each count over-states by at most the `error` it carries."""

from __future__ import annotations

import hashlib

MAX_KEY = 160  # characters of a descriptor shown; clients choose the values


class HeavyHitters:
    __slots__ = ("capacity", "_count", "_error")

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = capacity
        self._count: dict[tuple[str, str], int] = {}
        self._error: dict[tuple[str, str], int] = {}

    def add(self, key: tuple[str, str], n: int = 1) -> None:
        c = self._count
        if key in c:
            c[key] += n
            return
        if len(c) < self.capacity:
            c[key] = n
            self._error[key] = 0
            return
        victim = min(c, key=c.__getitem__)
        floor = c.pop(victim)
        del self._error[victim]
        c[key] = floor + n
        self._error[key] = floor

    def top(self, n: int = 10) -> list[dict[str, object]]:
        """[{rule, key, count, error}] by count, largest first."""
        best = sorted(self._count.items(), key=lambda kv: -kv[1])[:n]
        return [{"rule": r, "key": k, "count": v, "error": self._error[(r, k)]} for (r, k), v in best]


def shown_value(key: str, value: str, reveal: bool = False) -> str:
    """A descriptor value as /v1/top and the logs show it: the value of a ``header:``
    entry (an API key, a token: a client's secret) as ``sha256:`` and the first 16
    hex digits of its SHA-256, unless ``reveal`` (the sidecar's --show-values).
    The hash is plain, so an operator holding a key finds it:
    ``printf %s "$KEY" | sha256sum | cut -c1-16``."""
    if reveal or not key.startswith("header:"):
        return value
    return "sha256:" + hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def descriptor_text(entries, reveal: bool = False) -> str:
    """`key=value, ...` of one descriptor (header values hashed unless ``reveal``),
    cut to MAX_KEY characters."""
    s = ", ".join(f"{k}={shown_value(k, v, reveal)}" for k, v in entries)
    return s if len(s) <= MAX_KEY else s[: MAX_KEY - 1] + "…"
