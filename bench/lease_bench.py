"""Section leases: one client, one hot key on one redis-server, decisions/s with
leased quota (``http.leases: on``, netlimit/limit/stores/lease.py) vs netlimit's
one-round-trip path vs ``limits``' async RedisStorage (fixed window, redis-py).

The limit (fixed_window, 1,000,000,000 per minute) is far above what one client
reaches, so every decision is an admission: the figure is the admitting path,
not remembered denials.  The three sides take turns in short rounds on the same
uvloop event loop (the order rotated every round); a figure is the median over
rounds.  Round trips per decision are the server's ``INFO commandstats``
(evalsha for netlimit, every command for limits) before and after each side.

Run alone: ``python -m bench.lease_bench [--quick]``.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

from .common import Mode, Section, free_port, median, need, row, stop, wait_port

LIMIT = 1_000_000_000
PERIOD = 60.0
GOAL = 5.0  # decisions/s with leases vs the one-trip path (issue 33)


def _commandstats(port: int) -> dict[str, int]:
    import redis

    c = redis.Redis(port=port)
    try:
        stats = c.info("commandstats")
    finally:
        c.close()
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in stats.items()}


async def _drive(decide, budget: float) -> int:
    """One client deciding the hot key back to back for ``budget`` seconds."""
    n = 0
    end = time.perf_counter() + budget
    while True:
        for _ in range(64):
            await decide()
        n += 64
        if time.perf_counter() >= end:
            return n


async def _bench(port: int, mode: Mode, sec: Section) -> None:
    from limits import RateLimitItemPerMinute
    from limits.aio import strategies as lstrat
    from limits.aio.storage import RedisStorage as LimitsRedis

    from netlimit.limit.algorithms import FIXED_WINDOW, Limit
    from netlimit.limit.stores import LeasedRedisStore, RedisStore

    url = f"redis://127.0.0.1:{port}/0"
    lim = Limit(FIXED_WINDOW, LIMIT, PERIOD, name=f"bench-{uuid.uuid4().hex[:6]}")
    leased = LeasedRedisStore(url, key_prefix="nlL")
    plain = RedisStore(url, key_prefix="nlP")
    lstore = LimitsRedis(f"async+redis://127.0.0.1:{port}", implementation="redispy")
    limiter = lstrat.FixedWindowRateLimiter(lstore)
    item = RateLimitItemPerMinute(LIMIT)
    await plain.load_scripts(lim)
    from_lease, hit_leasing, hit = leased.from_lease, leased.hit_leasing, plain.hit

    async def with_leases() -> Any:
        d = from_lease("hot", lim, 1)
        return d if d is not None else await hit_leasing("hot", lim, 1)

    async def one_trip() -> Any:
        return await hit("hot", lim, 1)

    async def limits_async() -> Any:
        return await limiter.hit(item, "hot")

    sides = {"leases": with_leases, "one_trip": one_trip, "limits": limits_async}
    for f in sides.values():  # warm up: scripts loaded, connections open, the key hot
        for _ in range(200):
            await f()
    rounds, budget = mode.pick((4, 0.3), (20, 0.5))
    rates: dict[str, list[float]] = {k: [] for k in sides}
    calls: dict[str, list[int]] = {k: [0, 0] for k in sides}  # [decisions, server commands]
    names = list(sides)
    for r in range(rounds):
        for name in names[r % 3 :] + names[: r % 3]:
            a = _commandstats(port)
            t0 = time.perf_counter()
            n = await _drive(sides[name], budget)
            rates[name].append(n / (time.perf_counter() - t0))
            b = _commandstats(port)
            if name == "limits":
                cmds = sum(v - a.get(k, 0) for k, v in b.items() if k != "info")
            else:
                cmds = b.get("evalsha", 0) - a.get("evalsha", 0)
            calls[name][0] += n
            calls[name][1] += cmds
    rt = {k: c[1] / max(1, c[0]) for k, c in calls.items()}
    med = {k: median(v) for k, v in rates.items()}
    ratio = median([x / y for x, y in zip(rates["leases"], rates["one_trip"])])
    ratio_limits = median([x / y for x, y in zip(rates["leases"], rates["limits"])])
    st = leased.lease_stats
    sec.rows.append(
        row(
            "1 client, 1 hot key: leases vs the one-trip path",
            med["leases"],
            med["one_trip"],
            unit="decisions/s",
            peer_name="netlimit RedisStore, one EVALSHA per decision",
            goal=f">= {GOAL:g}x, <= 0.05 round trips/decision",
            met=ratio >= GOAL and rt["leases"] <= 0.05,
            ratio=ratio,
            note=f"round trips/decision {rt['leases']:.4f} vs {rt['one_trip']:.2f} (server-counted EVALSHA); "
            f"{st.granted} leases, {st.granted_units} units",
            round_trips=rt["leases"],
            peer_round_trips=rt["one_trip"],
        )
    )
    sec.rows.append(
        row(
            "1 client, 1 hot key: leases vs limits async",
            med["leases"],
            med["limits"],
            unit="decisions/s",
            peer_name="limits FixedWindowRateLimiter (async redis-py)",
            ratio=ratio_limits,
            note=f"limits: {rt['limits']:.2f} server commands/decision",
            round_trips=rt["leases"],
            peer_round_trips=rt["limits"],
        )
    )
    sec.details["rates"] = rates
    sec.details["round_trips_per_decision"] = rt
    await leased.close()
    await plain.close()


def run(mode: Mode) -> Section:
    sec = Section("leases", "Leased quota: one hot key through Redis, leases vs one round trip vs limits async")
    exe = need("redis-server")
    import uvloop

    port = free_port()
    d = tempfile.mkdtemp(prefix="nlbench-lease-")
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--dir", d, "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port, proc)
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_bench(port, mode, sec))
    finally:
        stop(proc)
        shutil.rmtree(d, ignore_errors=True)
    sec.details["what"] = __doc__.split("\n\n", 1)[1].strip()
    return sec


if __name__ == "__main__":
    s = run(Mode(quick="--quick" in sys.argv))
    for r in s.rows:
        print(
            f"{r['case']}: {r['netlimit']:,.0f} vs {r['peer']:,.0f} {r['unit']} "
            f"({r['ratio']:.2f}x; goal {r['goal'] or '-'}; met {r['met']}); {r['note']}"
        )
