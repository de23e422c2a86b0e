"""The core's counters besides the per-rule ones: store failures, fallbacks, latency."""

from __future__ import annotations

from bisect import bisect_left

from .hitters import HeavyHitters

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class Histogram:
    """A Prometheus-style histogram as plain numbers (no locks: one event loop)."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # last = above every bound
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.counts[bisect_left(self.bounds, v)] += 1
        self.sum += v
        self.count += 1


class CoreStats:
    """Counters of the core besides the per-rule ones (Rule.stats)."""

    __slots__ = (
        "store_errors",
        "fallbacks",
        "latency",
        "denied",
        "global_shadow",
        "no_descriptor",
        "request_errors",
        "over_key_budget",
    )

    def __init__(self) -> None:
        #: requests whose actions produced no descriptor: nothing to limit, answered OK
        #: (proxy mode forwards them unlimited)
        self.no_descriptor = 0
        self.global_shadow = 0  # OVER_LIMIT answers turned OK by http.shadow_mode (Lyft's global_shadow_mode)
        #: failures that open the breaker (timeouts, lost connections, failover replies)
        self.store_errors = {"timeout": 0, "connection": 0, "error": 0}
        #: errors the store answered about one call (its arguments): that decision followed
        #: on_store_failure, the breaker stayed closed
        self.request_errors = 0
        #: per (domain, rule): new keys beyond the rule's max_keys on the shared store
        #: in a period, decided as on_store_failure says (keybudget.py)
        self.over_key_budget: dict[tuple[str, str], int] = {}
        self.fallbacks = {"local": 0, "open": 0, "closed": 0}
        self.latency = Histogram()
        self.denied = HeavyHitters(64)  # the most denied descriptors, for `netlimit top`
