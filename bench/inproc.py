"""Section 1: in-process decisions per second, netlimit's MemoryStore vs the
``limits`` library's MemoryStorage, on the same key stream.

What is compared, like for like: one call per request that decides and
consumes, on a store already holding every key of the stream, returning the
verdict only:

* netlimit: ``allow_sync(key)`` (bench/admit.py: ``MemoryStore.hit_sync`` reduced to the
  verdict, like for like with limits) -> ``bool``, and the product's ``hit_sync`` -> Decision;
* limits: ``<Strategy>(MemoryStorage()).hit(item, key)`` -> ``bool``.

Beside it, netlimit's ``MemoryStore.hit_sync(key, limit)``, which returns a
full ``Decision`` (allowed, limit, remaining, retry_after, reset: what the
sidecar's headers need) -- more work than its peer does.  Equivalent
strategies: fixed_window = FixedWindowRateLimiter, sliding_window_counter =
SlidingWindowCounterRateLimiter, sliding_window_log = MovingWindowRateLimiter.
Token and leaky bucket have no ``limits`` equivalent: absolute figures.

Every case uses a limit of 1,000 per minute.  With one key the key is soon
over its limit, so that case measures mostly denials (a client being limited);
with many keys each key sees a few requests, so it measures admissions.
``limits``' MemoryStorage also runs a timer thread that scans every key every
10 ms; that is part of its cost and is left as it is.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from netlimit.limit.algorithms import (
    FIXED_WINDOW,
    LEAKY_BUCKET,
    SLIDING_WINDOW_COUNTER,
    SLIDING_WINDOW_LOG,
    TOKEN_BUCKET,
)

from .common import Mode, Section, interleaved_rates, round_ratio, row

LIMIT, PERIOD = 1000, 60
PEERS = {
    FIXED_WINDOW: "FixedWindowRateLimiter",
    SLIDING_WINDOW_COUNTER: "SlidingWindowCounterRateLimiter",
    SLIDING_WINDOW_LOG: "MovingWindowRateLimiter",
}
GOAL = 5.0


def key_stream(nkeys: int, n: int, seed: int = 1) -> tuple[list[str], list[str]]:
    """(distinct keys, a random stream of n draws from them); IPv4-like strings."""
    keys = [f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}" for i in range(nkeys)]
    if nkeys == 1:
        return keys, keys * n
    rng = random.Random(seed)
    return keys, [keys[rng.randrange(nkeys)] for _ in range(n)]


class _Timed:
    """Feeds a cyclic stream to ``call`` in blocks until ``budget`` seconds pass."""

    def __init__(self, call: Callable[[str], Any], stream: list[str], budget: float):
        self.call = call
        self.stream = stream
        self.budget = budget
        self.pos = 0

    def __call__(self, _round: int) -> tuple[int, float]:
        call, stream, block = self.call, self.stream, 1000
        n = 0
        t0 = time.perf_counter()
        end = t0 + self.budget
        while True:
            p = self.pos
            chunk = stream[p : p + block]
            if len(chunk) < block:
                p = 0
                chunk = stream[:block]
            self.pos = p + block
            for k in chunk:
                call(k)
            n += len(chunk)
            t = time.perf_counter()
            if t >= end:
                return n, t - t0


def _netlimit(alg: str, keys: list[str]):
    from netlimit.limit.algorithms import Limit
    from netlimit.limit.stores import MemoryStore

    from .admit import allow_fn

    lim = Limit(alg, LIMIT, float(PERIOD))
    out = []
    for name in ("allow_sync", "hit_sync"):
        store = MemoryStore(max_keys=max(2 * len(keys), 100_000))
        if name == "allow_sync":
            allow = allow_fn(store, lim)
            for k in keys:
                allow(k)
            out.append(allow)
        else:
            hit = store.hit_sync
            for k in keys:
                hit(k, lim)
            out.append(lambda k, hit=hit: hit(k, lim))
    return out


def _limits(alg: str, keys: list[str]):
    from limits import RateLimitItemPerMinute, strategies
    from limits.storage import MemoryStorage

    storage = MemoryStorage()
    strat = getattr(strategies, PEERS[alg])(storage)
    item = RateLimitItemPerMinute(LIMIT)
    hit = strat.hit
    for k in keys:
        hit(item, k)
    return (lambda k: hit(item, k)), storage


def _close_limits(storage) -> None:
    storage.timer.cancel()
    storage.timer.join(timeout=10)  # a scan in progress would race the reset
    storage.reset()


def run(mode: Mode) -> Section:
    sec = Section("inproc", "In-process decisions/s, memory store: netlimit hit_sync vs limits hit")
    key_counts = mode.pick([1, 5_000], [1, 100_000])
    n_stream = mode.pick(20_000, 400_000)
    budget = mode.pick(0.08, 0.6)
    rounds = mode.pick(2, 5)
    for nkeys in key_counts:
        keys, stream = key_stream(nkeys, n_stream)
        for alg in (FIXED_WINDOW, SLIDING_WINDOW_COUNTER, SLIDING_WINDOW_LOG, TOKEN_BUCKET, LEAKY_BUCKET):
            allow, full = _netlimit(alg, keys)
            runners = {"netlimit": _Timed(allow, stream, budget), "netlimit_decision": _Timed(full, stream, budget)}
            storage = None
            if alg in PEERS:
                lm_call, storage = _limits(alg, keys)
                runners["limits"] = _Timed(lm_call, stream, budget)
            try:
                res = interleaved_rates(runners, rounds)
            finally:
                if storage is not None:
                    _close_limits(storage)
            del allow, full, runners
            case = f"{alg}, {nkeys:,} key{'s' if nkeys > 1 else ''}"
            rates = res["rates"]
            med = res["median"]
            sec.details[case] = {k: [round(x) for x in v] for k, v in rates.items()}
            if alg in PEERS:
                ratio = round_ratio(rates, "netlimit", "limits")
                full_ratio = round_ratio(rates, "netlimit_decision", "limits")
                sec.rows.append(
                    row(
                        case,
                        med["netlimit"],
                        med["limits"],
                        unit="decisions/s",
                        peer_name=f"limits {PEERS[alg]}.hit",
                        ratio=ratio,
                        goal=f">= {GOAL:g}x",
                        met=ratio >= GOAL,
                        note=f"with a full Decision (hit_sync): {med['netlimit_decision']:,.0f}/s = {full_ratio:.1f}x",
                        netlimit_decision=med["netlimit_decision"],
                        ratio_decision=full_ratio,
                    )
                )
            else:
                sec.rows.append(
                    row(
                        case,
                        med["netlimit"],
                        None,
                        unit="decisions/s",
                        peer_name="(no equivalent in limits)",
                        note=f"with a full Decision (hit_sync): {med['netlimit_decision']:,.0f}/s",
                        netlimit_decision=med["netlimit_decision"],
                    )
                )
    sec.details["what"] = (
        "netlimit allow_sync (bench/admit.py) and limits <Strategy>.hit both return a bool "
        "(like for like); hit_sync (a full Decision) is reported beside. "
        f"Limit {LIMIT}/minute; stores pre-filled with every key; ratio = median of "
        "per-round ratios (rounds interleaved)"
    )
    return sec
