"""Section 4: memory per active key (RSS growth), netlimit's MemoryStore vs
``limits``' MemoryStorage, one fresh child process per case.

Each child imports everything, reads its RSS, then makes N distinct keys
(IPv4-like strings built inside the loop, so the key strings count: a store
keeps the keys it is given) decide once each, and reads its RSS again:
(after - before) / N = bytes per key, all in (dict slots, key string, state).
netlimit's store is created with ``max_keys = N`` so nothing is evicted;
limits' timer thread is stopped once the keys are in, before the reading.
"""

from __future__ import annotations

import json
import subprocess
import sys

from netlimit.limit.algorithms import (
    FIXED_WINDOW,
    LEAKY_BUCKET,
    SLIDING_WINDOW_COUNTER,
    SLIDING_WINDOW_LOG,
    TOKEN_BUCKET,
)

from .common import Mode, Section, row
from .inproc import LIMIT, PEERS

GOAL = 150.0
ALGS = (FIXED_WINDOW, SLIDING_WINDOW_COUNTER, TOKEN_BUCKET, LEAKY_BUCKET, SLIDING_WINDOW_LOG)
PER_SECOND = (FIXED_WINDOW, SLIDING_WINDOW_COUNTER)  # again with a 1 s period

_CHILD = r"""
import gc, json, sys, time
impl, alg, n, period = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
def rss():
    gc.collect()
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
if impl == "netlimit":
    from netlimit.limit.algorithms import Limit
    from netlimit.limit.stores import MemoryStore
    lim = Limit(alg, %(limit)d, period)
    store = MemoryStore(max_keys=n)
    hit = store.hit_sync
    before = rss()
    for i in range(n):
        hit(f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}", lim)
    after = rss()
    assert len(store) == n, len(store)
else:
    from limits import RateLimitItemPerMinute, strategies
    from limits.storage import MemoryStorage
    storage = MemoryStorage()
    strat = getattr(strategies, %(peers)r[alg])(storage)
    item = RateLimitItemPerMinute(%(limit)d)
    hit = strat.hit
    before = rss()
    for i in range(n):
        hit(item, f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}")
    storage.timer.cancel()
    after = rss()
print(json.dumps({"before": before, "after": after, "n": n}))
""" % {"limit": LIMIT, "peers": PEERS}


def measure(impl: str, alg: str, n: int, timeout: float = 600, period: float = 60.0) -> float:
    """Bytes per key; ``period`` applies to netlimit (limits' item is per minute)."""
    p = subprocess.run(
        [sys.executable, "-c", _CHILD, impl, alg, str(n), repr(period)], capture_output=True, text=True, timeout=timeout
    )
    if p.returncode != 0:
        raise RuntimeError(f"memory child {impl} {alg}: {p.stderr.strip()[-800:]}")
    d = json.loads(p.stdout.strip().splitlines()[-1])
    return (d["after"] - d["before"]) / d["n"]


def run(mode: Mode) -> Section:
    sec = Section("memory", "Memory per active key (RSS growth / keys), memory store: netlimit vs limits")
    n = mode.pick(20_000, 1_000_000)
    n_peer = mode.pick(20_000, 1_000_000)
    for alg in ALGS:
        nl = measure("netlimit", alg, n)
        peer = measure("limits", alg, n_peer) if alg in PEERS else None
        counted = alg != SLIDING_WINDOW_LOG
        sec.rows.append(
            row(
                f"{alg}, {n:,} keys",
                nl,
                peer,
                unit="bytes/key",
                better="lower",
                peer_name=f"limits {PEERS[alg]} ({n_peer:,} keys)" if peer is not None else "(no equivalent in limits)",
                goal=f"<= {GOAL:g} B/key" if counted else "",
                met=(nl <= GOAL) if counted else None,
                note="" if counted else "one request per key: the log holds one timestamp",
            )
        )
    # The window states pack the window index with the counts in one int; at a
    # 1 s period the index is ~31 bits rather than ~25, which is what pushes an
    # int past 2**60 (three 30-bit digits: a 48-byte block instead of 32).
    for alg in PER_SECOND:
        nl = measure("netlimit", alg, n, period=1.0)
        sec.rows.append(
            row(
                f"{alg}, {n:,} keys, {LIMIT:,}/s",
                nl,
                None,
                unit="bytes/key",
                better="lower",
                peer_name="(limits: see the per-minute row)",
                goal=f"<= {GOAL:g} B/key",
                met=nl <= GOAL,
                note="period 1 s: a wider window index in the packed state",
            )
        )
    sec.details["what"] = __doc__.split("\n\n", 1)[1].strip()
    return sec
