"""One sidecar's worth of decisions on one hot key (tests/limit/test_leases.py runs
several of these as separate processes against one real redis-server).

argv: url prefix limit period rate_per_s start_at(epoch s) duration_s leases(0|1) [algorithm]
Prints one JSON line: {window index: [attempts, admitted]}.  A store call that
fails (a loaded host's timeout) is a denial, as on_store_failure closed answers it,
counted in the window of the decision before it; their number goes to stderr
(``store errors N``).  A decision's window
is the one whose end is ``now + reset`` (redis-server and this process read the
same clock); bounded by the duration, nothing else."""

from __future__ import annotations

import asyncio
import json
import sys
import time

from netlimit.limit.algorithms import FIXED_WINDOW, Limit
from netlimit.limit.stores import LeasedRedisStore, StoreError


async def main(
    url: str, prefix: str, limit: int, period: float, rate: float, start: float, dur: float, on: bool, alg: str
):
    store = LeasedRedisStore(url, key_prefix=prefix, timeout_ms=1000)
    lim = Limit(alg, limit, period, name="hot")
    out: dict[int, list[int]] = {}
    await asyncio.sleep(max(0.0, start - time.time()))
    t0 = time.monotonic()
    done = 0
    errors = 0
    w = 0
    try:
        while True:
            el = time.monotonic() - t0
            if el >= dur:
                break
            if done >= el * rate:
                await asyncio.sleep(0.001)
                continue
            d = store.from_lease("k", lim, 1) if on else None
            done += 1
            if d is None:
                try:
                    d = await (store.hit_leasing("k", lim, 1) if on else store.hit("k", lim, 1))
                except StoreError:
                    errors += 1
                    out.setdefault(w, [0, 0])[0] += 1
                    continue
            w = round((time.time() + d.reset) / period) - 1
            c = out.setdefault(w, [0, 0])
            c[0] += 1
            c[1] += d.allowed
    finally:
        await store.close()
    print(f"store errors {errors}", file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    a = sys.argv[1:]
    asyncio.run(
        main(
            a[0],
            a[1],
            int(a[2]),
            float(a[3]),
            float(a[4]),
            float(a[5]),
            float(a[6]),
            a[7] == "1",
            a[8] if len(a) > 8 else FIXED_WINDOW,
        )
    )
