"""Cold decisions (every one on a key never seen before) through the lease layer
or without it, for bench/lease_cold_instructions.sh and a quick timing (issue 33:
with ``http.leases: on`` a cold key costs what it costs with leases off).

    python bench/lease_cold_decisions.py on|off N [REDIS_URL]    N decisions, one side
    python bench/lease_cold_decisions.py time [N] [ROUNDS]        both sides, interleaved, us per decision

``on`` is what Limiter._hit does for a rule that leases (from_lease while leases are
held, then hit_leasing), ``off`` is RedisStore.hit.  Without REDIS_URL the store's
Redis call is stubbed (the node answers at once with a packed admission): only the
Python side of one decision is measured, the lease layer's share the largest it gets.
With REDIS_URL (a real redis-server) the decisions go to it, one at a time."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from netlimit.limit.algorithms import FIXED_WINDOW, Limit
from netlimit.limit.stores import LeasedRedisStore, RedisStore

STUB_URL = "redis://127.0.0.1:1/0"


class _Node:
    """A RespClient whose every command is answered at once: remaining 99, reset 1 s
    (a packed admission: redis.py's _decode)."""

    address = "stub"

    def __init__(self) -> None:
        self.sent = 0

    def send_packed(self, data: bytes, timeout: float | None = None) -> asyncio.Future[Any]:
        self.sent += 1
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(99 * 10**9 + 1_000_000)
        return fut


def stores(url: str | None) -> tuple[LeasedRedisStore, RedisStore]:
    on = LeasedRedisStore(url or STUB_URL, key_prefix="nlLC", timeout_ms=1000)
    off = RedisStore(url or STUB_URL, key_prefix="nlPC", timeout_ms=1000)
    if url is None:
        for s in (on, off):
            s._node = _Node()  # type: ignore[assignment]
    return on, off


def sides(on_store: LeasedRedisStore, off_store: RedisStore, lim: Limit) -> dict[str, Any]:
    async def on(k: str) -> Any:  # what Limiter._hit does for a rule that leases
        d = on_store.from_lease(k, lim, 1) if on_store.leases else None
        return d if d is not None else await on_store.hit_leasing(k, lim, 1)

    async def on_before(k: str) -> Any:  # the same before the store had `leases` (a tree before issue 33's)
        d = on_store.from_lease(k, lim, 1) if on_store.holds_leases else None
        return d if d is not None else await on_store.hit_leasing(k, lim, 1)

    if not hasattr(on_store, "leases"):
        on = on_before

    async def off(k: str) -> Any:
        return await off_store.hit(k, lim, 1)

    return {"on": on, "off": off}


def keys(tag: int, n: int) -> list[str]:
    return [f"10.{tag}.{i >> 8 & 255}.{i & 255}:{i}" for i in range(n)]


async def one_side(side: str, n: int, url: str | None) -> None:
    lim = Limit(FIXED_WINDOW, 100, 60.0, name="bench-cold")
    on_store, off_store = stores(url)
    if url is not None:
        await off_store.load_scripts(lim)
    decide = sides(on_store, off_store, lim)[side]
    ks = keys(0, n)
    for i, k in enumerate(ks):
        await decide(k)
        if not i & 63:  # an event loop iteration now and then, as real I/O gives (the tick timer runs)
            await asyncio.sleep(0)
    assert on_store.lease_stats.granted == 0
    await on_store.close()
    await off_store.close()


async def timed(n: int, rounds: int) -> None:
    lim = Limit(FIXED_WINDOW, 100, 60.0, name="bench-cold")
    on_store, off_store = stores(None)
    fs = sides(on_store, off_store, lim)
    cpu: dict[str, list[float]] = {"on": [], "off": []}
    for r in range(rounds):
        for name in ("on", "off") if r % 2 == 0 else ("off", "on"):
            ks = keys(r % 250, n)
            decide = fs[name]
            c0 = time.process_time()
            for i, k in enumerate(ks):
                await decide(k)
                if not i & 63:
                    await asyncio.sleep(0)
            cpu[name].append((time.process_time() - c0) / n * 1e6)
    on_store._stop_clock()
    med = {k: sorted(v)[len(v) // 2] for k, v in cpu.items()}
    print(
        f"stubbed Redis, {n:,} cold keys x {rounds} rounds: CPU us per decision on {med['on']:.2f}, "
        f"off {med['off']:.2f}, lease layer {med['on'] - med['off']:.2f} (medians)"
    )
    print("per round on/off:", " ".join(f"{a / b:.3f}" for a, b in zip(cpu["on"], cpu["off"])))


def main() -> None:
    if sys.argv[1] == "time":
        n = int(sys.argv[2]) if len(sys.argv) > 2 else 50_000
        rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 10
        asyncio.run(timed(n, rounds))
    else:
        asyncio.run(one_side(sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None))


if __name__ == "__main__":
    main()
