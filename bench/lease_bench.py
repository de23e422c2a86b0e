"""Section leases: one client, one hot key on one redis-server, decisions/s with
leased quota (``http.leases: on``, netlimit/limit/stores/lease.py) vs netlimit's
one-round-trip path vs ``limits``' async RedisStorage (fixed window, redis-py);
the same hot key through a 3-primary cluster with a replica each (leases vs one
trip; a lease call that admits waits for the replica, WAIT 1); through the
Envoy RLS gRPC door (two real ``netlimit sidecar --grpc`` processes on one
Redis, leases on vs off, 16 streams on one connection); 100,000 cold keys
(every decision a key never seen: leases on vs off, 16 clients).

The limit (fixed_window, 1,000,000,000 per minute) is far above what one client
reaches, so every decision is an admission: the figure is the admitting path,
not remembered denials.  The three sides take turns in short rounds on the same
uvloop event loop (the order rotated every round); a figure is the median over
rounds.  Round trips per decision are the server's ``INFO commandstats``
(evalsha for netlimit, every command for limits) before and after each side.

Run alone: ``python -m bench.lease_bench [--quick] [--cold]`` (``--cold``: the cold-key row only).
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from .common import Mode, Section, median, redis_cluster, redis_server, round_ratio, row

LIMIT = 1_000_000_000
PERIOD = 60.0
GOAL = 5.0  # decisions/s with leases vs the one-trip path (issue 33)


def _commandstats(*ports: int) -> dict[str, int]:
    """Every command's calls, summed over the servers at ``ports``."""
    import redis

    out: dict[str, int] = {}
    for port in ports:
        c = redis.Redis(port=port)
        try:
            stats = c.info("commandstats")
        finally:
            c.close()
        for k, v in stats.items():
            name = k.removeprefix("cmdstat_")
            out[name] = out.get(name, 0) + v["calls"]
    return out


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


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
    leased = LeasedRedisStore(url, key_prefix="nlL", timeout_ms=1000)
    plain = RedisStore(url, key_prefix="nlP", timeout_ms=1000)
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


async def _hot_cluster(url: str, ports: list[int], mode: Mode, sec: Section) -> None:
    """One client, one hot key through the cluster: leases vs one EVALSHA per decision."""
    from netlimit.limit.algorithms import FIXED_WINDOW, Limit
    from netlimit.limit.stores import LeasedRedisStore, RedisStore

    lim = Limit(FIXED_WINDOW, LIMIT, PERIOD, name=f"bench-c-{uuid.uuid4().hex[:6]}")
    leased = LeasedRedisStore(url, key_prefix="nlLC", timeout_ms=1000)
    plain = RedisStore(url, key_prefix="nlPC", timeout_ms=1000)
    await leased.start()
    await plain.start()
    from_lease, hit_leasing, hit = leased.from_lease, leased.hit_leasing, plain.hit

    async def with_leases() -> Any:
        d = from_lease("hot", lim, 1)
        return d if d is not None else await hit_leasing("hot", lim, 1)

    async def one_trip() -> Any:
        return await hit("hot", lim, 1)

    sides = {"leases": with_leases, "one_trip": one_trip}
    for f in sides.values():
        for _ in range(200):
            await f()
    rounds, budget = mode.pick((4, 0.3), (12, 0.5))
    rates: dict[str, list[float]] = {k: [] for k in sides}
    calls = {k: [0, 0, 0] for k in sides}  # decisions, EVALSHA, WAIT + ROLE
    load0 = _load()
    for r in range(rounds):
        for name in list(sides) if r % 2 == 0 else list(sides)[::-1]:
            a = _commandstats(*ports)
            t0 = time.perf_counter()
            n = await _drive(sides[name], budget)
            rates[name].append(n / (time.perf_counter() - t0))
            b = _commandstats(*ports)
            calls[name][0] += n
            calls[name][1] += b.get("evalsha", 0) - a.get("evalsha", 0)
            calls[name][2] += sum(b.get(c, 0) - a.get(c, 0) for c in ("wait", "role"))
    rt = {k: (c[1] + c[2]) / max(1, c[0]) for k, c in calls.items()}
    ratio = round_ratio(rates, "leases", "one_trip")
    sec.rows.append(
        row(
            "1 client, 1 hot key, 3-primary cluster (+1 replica each): leases vs the one-trip path",
            median(rates["leases"]),
            median(rates["one_trip"]),
            unit="decisions/s",
            peer_name="netlimit RedisStore on the same cluster, one EVALSHA per decision",
            goal=f">= {GOAL:g}x, <= 0.05 round trips/decision",
            met=ratio >= GOAL and rt["leases"] <= 0.05,
            ratio=ratio,
            note=f"round trips/decision {rt['leases']:.4f} (EVALSHA {calls['leases'][1]} + WAIT/ROLE "
            f"{calls['leases'][2]} for {calls['leases'][0]} decisions) vs {rt['one_trip']:.2f}; "
            f"load average {load0[0]} -> {_load()[0]}",
            round_trips=rt["leases"],
            peer_round_trips=rt["one_trip"],
        )
    )
    sec.details["cluster_rates"] = rates
    sec.details["cluster_calls"] = calls
    await leased.close()
    await plain.close()


async def _cold(port: int, mode: Mode, sec: Section) -> None:
    """Every decision on a key never seen before (the long tail of per-address
    keys), 16 clients: leases on (as Limiter._hit: from_lease while leases are held,
    then hit_leasing: the one-trip path of a cold key) vs off (RedisStore.hit)."""
    from netlimit.limit.algorithms import FIXED_WINDOW, Limit
    from netlimit.limit.stores import LeasedRedisStore, RedisStore

    lim = Limit(FIXED_WINDOW, 100, PERIOD, name=f"bench-cold-{uuid.uuid4().hex[:6]}")
    leased = LeasedRedisStore(f"redis://127.0.0.1:{port}/0", key_prefix="nlLK", timeout_ms=1000)
    plain = RedisStore(f"redis://127.0.0.1:{port}/0", key_prefix="nlPK", timeout_ms=1000)
    await plain.load_scripts(lim)
    keys, rounds = mode.pick((10_000, 4), (100_000, 10))
    per = keys // rounds

    async def on(k: str) -> Any:  # what Limiter._hit does
        d = leased.from_lease(k, lim, 1) if leased.leases else None
        return d if d is not None else await leased.hit_leasing(k, lim, 1)

    async def off(k: str) -> Any:
        return await plain.hit(k, lim, 1)

    sides = {"on": on, "off": off}
    for f in sides.values():  # connections open, the script loaded
        for i in range(100):
            await f(f"warm{i}")
    rates: dict[str, list[float]] = {k: [] for k in sides}
    #: this process's CPU time per decision (us): what the load of other processes moves least
    cpu: dict[str, list[float]] = {k: [] for k in sides}
    evalsha = {k: [0, 0] for k in sides}
    load0 = _load()
    for r in range(rounds):
        for name in list(sides) if r % 2 == 0 else list(sides)[::-1]:
            ks = [f"10.{r}.{i >> 8 & 255}.{i & 255}:{i}" for i in range(per)]
            a = _commandstats(port)
            c0 = time.process_time()
            t0 = time.perf_counter()
            await asyncio.gather(*(_walk(sides[name], ks[c::16]) for c in range(16)))
            rates[name].append(per / (time.perf_counter() - t0))
            cpu[name].append((time.process_time() - c0) / per * 1e6)
            b = _commandstats(port)
            evalsha[name][0] += per
            evalsha[name][1] += b.get("evalsha", 0) - a.get("evalsha", 0)
    ratio = round_ratio(rates, "on", "off")
    held = len(leased._leases)
    sec.rows.append(
        row(
            f"{keys:,} cold keys, 16 clients: leases on vs off",
            median(rates["on"]),
            median(rates["off"]),
            unit="decisions/s",
            peer_name="netlimit RedisStore (leases off)",
            goal="unchanged within noise (0.9x-1.1x)",
            met=0.9 <= ratio <= 1.1,
            ratio=ratio,
            note=f"EVALSHA/decision {evalsha['on'][1] / evalsha['on'][0]:.2f} vs "
            f"{evalsha['off'][1] / evalsha['off'][0]:.2f}; leases taken {leased.lease_stats.granted} "
            f"(held {held}); CPU per decision {median(cpu['on']):.1f} vs {median(cpu['off']):.1f} us "
            f"(median per-round ratio {round_ratio(cpu, 'on', 'off'):.3f}); "
            f"load average {load0[0]} -> {_load()[0]}",
        )
    )
    sec.details["cold_rates"] = rates
    sec.details["cold_cpu_us"] = cpu
    sec.details["cold_round_ratios"] = [x / y for x, y in zip(rates["on"], rates["off"])]
    await leased.close()
    await plain.close()


async def _walk(decide, keys: list[str]) -> None:
    for k in keys:
        await decide(k)


GRPC_CONFIG = """\
version: 1
http:
  domain: bench
  store_timeout_ms: 1000
  leases: {leases}
  descriptors:
    - key: path
      rate_limit: {{unit: hour, requests_per_unit: 4000000000, name: hot-path}}
"""


def _grpc(port: int, mode: Mode, sec: Section) -> None:
    """The Envoy RLS door: two real sidecars on the one Redis, leases on and off,
    one hot descriptor from 16 streams on one connection, alternating rounds."""
    from . import grpc_bench as gb

    rounds, seconds = mode.pick((3, 1.0), (6, 3.0))
    procs: list[Any] = []
    with tempfile.TemporaryDirectory(prefix="nlbench-lease-grpc-") as d:
        targets = {}
        try:
            for name, on in (("on", "on"), ("off", "off")):
                cfg = Path(d) / f"{name}.yaml"
                cfg.write_text(GRPC_CONFIG.format(leases=on))
                p, gport = gb._start_sidecar(cfg, f"redis://127.0.0.1:{port}/0")
                procs.append(p)
                targets[name] = gport
            load0 = _load()
            rates, trips = asyncio.run(_grpc_measure(targets, port, rounds, seconds))
        finally:
            for p in procs:
                p.stop()
    ratio = round_ratio(rates, "on", "off")
    rt = {k: v[1] / max(1, v[0]) for k, v in trips.items()}
    sec.rows.append(
        row(
            "gRPC door (Envoy RLS), 1 hot descriptor, 16 streams: leases on vs off",
            median(rates["on"]),
            median(rates["off"]),
            unit="decisions/s",
            peer_name="the same sidecar, leases off (one EVALSHA per decision)",
            goal="<= 0.05 round trips/decision",
            met=rt["on"] <= 0.05,
            ratio=ratio,
            note=f"EVALSHA/decision {rt['on']:.4f} vs {rt['off']:.2f} (server-counted); the door (Python gRPC, "
            f"client in the same host) bounds both; load average {load0[0]} -> {_load()[0]}",
            round_trips=rt["on"],
            peer_round_trips=rt["off"],
        )
    )
    sec.details["grpc_rates"] = rates


async def _grpc_measure(targets: dict[str, int], port: int, rounds: int, seconds: float):
    import grpc

    from netlimit.rls.proto import envoy_ratelimit_pb2, rls_pb2, rls_pb2_grpc

    from . import grpc_bench as gb

    D = envoy_ratelimit_pb2.RateLimitDescriptor
    req = rls_pb2.RateLimitRequest(domain="bench", descriptors=[D(entries=[D.Entry(key="path", value="/hot")])])
    chans = {n: grpc.aio.insecure_channel(f"127.0.0.1:{p}") for n, p in targets.items()}
    calls = {n: rls_pb2_grpc.RateLimitServiceStub(c).ShouldRateLimit for n, c in chans.items()}
    rates: dict[str, list[float]] = {n: [] for n in calls}
    trips = {n: [0, 0] for n in calls}
    try:
        for n in calls:  # connect, warm up, the key hot
            await gb._round(calls[n], lambda i: req, min(0.5, seconds), [])
        for r in range(rounds):
            for n in list(calls) if r % 2 == 0 else list(calls)[::-1]:
                a = _commandstats(port)
                done, errors, el = await gb._round(calls[n], lambda i: req, seconds, [])
                b = _commandstats(port)
                if errors:
                    raise RuntimeError(f"gRPC door ({n}): {errors} failed calls of {done}")
                rates[n].append(done / el)
                trips[n][0] += done
                trips[n][1] += b.get("evalsha", 0) - a.get("evalsha", 0)
    finally:
        for c in chans.values():
            await c.close()
    return rates, trips


def run(mode: Mode) -> Section:
    sec = Section(
        "leases",
        "Leased quota: one hot key through Redis (one server, the cluster, the gRPC door), "
        "leases vs one round trip vs limits async; cold keys unchanged",
    )
    import uvloop

    sec.details["loadavg_at_start"] = _load()
    with redis_server("nlbench-lease-") as (port, _proc):
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_bench(port, mode, sec))
            runner.run(_cold(port, mode, sec))
        _grpc(port, mode, sec)
    with redis_cluster(3, 1) as prim, asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        url = "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in prim[:2]) + "/"
        runner.run(_hot_cluster(url, prim, mode, sec))
    sec.details["loadavg_at_end"] = _load()
    sec.details["what"] = __doc__.split("\n\n", 1)[1].strip()
    return sec


def run_cold(mode: Mode) -> Section:
    """The cold-key row alone (``--cold``): leases on vs off, interleaved."""
    import uvloop

    sec = Section("leases", "cold keys, leases on vs off")
    with redis_server("nlbench-lease-") as (port, _proc), asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_cold(port, mode, sec))
    return sec


if __name__ == "__main__":
    s = (run_cold if "--cold" in sys.argv else run)(Mode(quick="--quick" in sys.argv))
    for r in s.rows:
        print(
            f"{r['case']}: {r['netlimit']:,.0f} vs {r['peer']:,.0f} {r['unit']} "
            f"({r['ratio']:.2f}x; goal {r['goal'] or '-'}; met {r['met']}); {r['note']}"
        )
    if "cold_round_ratios" in s.details:
        print("per round, on/off:", " ".join(f"{x:.3f}" for x in s.details["cold_round_ratios"]))
        print("CPU us/decision on:", " ".join(f"{x:.1f}" for x in s.details["cold_cpu_us"]["on"]))
        print("CPU us/decision off:", " ".join(f"{x:.1f}" for x in s.details["cold_cpu_us"]["off"]))
