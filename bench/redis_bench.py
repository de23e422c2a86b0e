"""Section 2: decisions/s and latency per decision through Redis, netlimit's
RedisStore vs ``limits``' async RedisStorage, on one redis-server that this
section starts on a free loopback port (killed in ``finally``).

Both sides run on the same uvloop event loop in this process, with the same
key stream (10,000 keys, limit 1,000/minute, so admissions) and 1 or 16
concurrent clients (asyncio tasks, each awaiting its decision before the
next).  netlimit returns a full Decision, limits a bool.  Clients: netlimit's
RedisStore built from a ``redis://`` URL uses its own lean asyncio client
(``netlimit/limit/stores/resp.py``: one connection, hiredis parsing, concurrent
commands auto-pipelined); limits uses redis-py's asyncio client
(``implementation="redispy"``, a connection pool).  With one client, limits'
sync RedisStorage (redis-py's blocking client) runs in the same rounds as a
reference row: it is what a sync app would use, but it would stall the event
loop of an asyncio sidecar, so the goal is measured against the async one.

The sides take turns in many short rounds (full mode: 30 of 0.25 s each, the
order reversed every round), and a ratio is the median of the per-round
ratios.  This host's speed drifts by +-20 % from one second to the next; with
6 rounds of 1.2 s the per-round ratios of one run spread over 1.6x-2.5x, and
the median moved by 0.2 between runs.

Round trips: for netlimit the commands its client sends (each has exactly one
reply; auto-pipelining lets several share a socket write, reported as
writes/decision), for limits every ``send_packed_command`` of redis-py (a
pipeline is one).  The server's ``INFO commandstats`` is read before and after
each side's run and reported per decision (commands a Lua script calls are
counted there too, so ``evalsha`` is the round trip and the rest run inside it).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from .common import Mode, Section, median, redis_server, round_ratio, row
from .inproc import LIMIT, PEERS, key_stream

GOAL = 2.0


class _Counter:
    """Counts redis-py writes to the socket (round trips) while installed."""

    def __init__(self) -> None:
        from redis.asyncio.connection import AbstractConnection

        self.cls = AbstractConnection
        self.orig = AbstractConnection.send_packed_command
        self.n = 0
        counter = self

        async def send_packed_command(conn, command, check_health=True):
            counter.n += 1
            return await counter.orig(conn, command, check_health)

        AbstractConnection.send_packed_command = send_packed_command

    def close(self) -> None:
        self.cls.send_packed_command = self.orig


def _lean_counts(store: Any) -> tuple[int | None, int | None]:
    """Commands sent and socket writes so far by the store's lean client (None: redis-py)."""
    c = store.client
    if hasattr(c, "commands_sent"):
        return c.commands_sent, c.writes
    return None, None


def _commandstats(port: int) -> dict[str, int]:
    import redis

    c = redis.Redis(port=port)
    try:
        stats = c.info("commandstats")
    finally:
        c.close()
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in stats.items()}


def _delta(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    out = {k: b.get(k, 0) - a.get(k, 0) for k in b}
    return {k: v for k, v in out.items() if v > 0 and k not in ("info",)}


async def _drive(decide, stream: list[str], clients: int, budget: float) -> tuple[int, float, list[float], int]:
    """``clients`` tasks call ``decide(key)`` back to back until ``budget`` s pass."""
    lat: list[float] = []
    errors = 0
    n_stream = len(stream)
    perf = time.perf_counter
    t0 = perf()
    end = t0 + budget

    async def client(i: int) -> None:
        nonlocal errors
        pos = (i * 7919) % n_stream
        while True:
            k = stream[pos]
            pos = pos + 1 if pos + 1 < n_stream else 0
            a = perf()
            try:
                await decide(k)
            except Exception:  # counted and reported
                errors += 1
            b = perf()
            lat.append(b - a)
            if b >= end:
                return

    await asyncio.gather(*(client(i) for i in range(clients)))
    return len(lat), perf() - t0, lat, errors


def _pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def _p50_p99(p: dict[str, tuple[float, float]], peer: str) -> str:
    return f"p50/p99 ms: {p['netlimit'][0]:.2f}/{p['netlimit'][1]:.2f} vs {p[peer][0]:.2f}/{p[peer][1]:.2f}"


async def _bench(port: int, mode: Mode, sec: Section) -> None:
    from limits import RateLimitItemPerMinute
    from limits import strategies as sync_strat
    from limits.aio import strategies as lstrat
    from limits.aio.storage import RedisStorage as LimitsRedis
    from limits.storage import RedisStorage as LimitsSyncRedis

    from netlimit.limit.algorithms import Limit
    from netlimit.limit.stores import RedisStore

    url = f"redis://127.0.0.1:{port}/0"
    nl_store = RedisStore(url, timeout_ms=2000)
    await nl_store.load_scripts(*(Limit(alg, LIMIT, 60.0) for alg in PEERS))
    lm_storage = LimitsRedis(f"async+redis://127.0.0.1:{port}/0", implementation="redispy")
    sync_storage = LimitsSyncRedis(f"redis://127.0.0.1:{port}/0")
    _, stream = key_stream(10_000, mode.pick(20_000, 100_000), seed=2)
    budget = 0.25  # short turns, many of them: every side sees the same host
    rounds = mode.pick(2, 30)
    counter = _Counter()
    try:
        for alg in PEERS:
            lim = Limit(alg, LIMIT, 60.0)
            item = RateLimitItemPerMinute(LIMIT, namespace=f"LIMITER-{alg}")  # keys apart per strategy
            strat = getattr(lstrat, PEERS[alg])(lm_storage)

            async def nl(k: str, lim=lim) -> Any:
                return await nl_store.hit(k, lim)

            async def lm(k: str, strat=strat, item=item) -> Any:
                return await strat.hit(item, k)

            sync_item = RateLimitItemPerMinute(LIMIT, namespace=f"LIMITER-sync-{alg}")
            sstrat = getattr(sync_strat, PEERS[alg])(sync_storage)

            async def ls(k: str, strat=sstrat, item=sync_item) -> Any:
                return strat.hit(item, k)  # blocking: one caller at a time, as a sync app calls it

            await nl("warm")
            await lm("warm")
            await ls("warm")
            for clients in (1, 16):
                # 1 client: limits' sync client too, for reference (not the goal's
                # peer: a sync client blocks the event loop the sidecar runs on)
                sides = (("netlimit", nl), ("limits", lm)) + ((("limits_sync", ls),) if clients == 1 else ())
                rates: dict[str, list[float]] = {name: [] for name, _ in sides}
                lats: dict[str, list[float]] = {name: [] for name, _ in sides}
                trips: dict[str, list[float]] = {name: [] for name, _ in sides}
                cmds: dict[str, dict[str, float]] = {}
                errors = {name: 0 for name, _ in sides}
                writes: list[float] = []
                for r in range(rounds):
                    for name, fn in sides if r % 2 == 0 else sides[::-1]:
                        before = _commandstats(port)
                        counter.n = 0
                        c0, w0 = _lean_counts(nl_store)
                        n, secs, lat, err = await _drive(fn, stream, clients, budget)
                        c1, w1 = _lean_counts(nl_store)
                        sent = counter.n
                        if name == "netlimit" and c1 is not None:
                            sent = c1 - c0
                            writes.append((w1 - w0) / n)
                        after = _commandstats(port)
                        rates[name].append(n / secs)
                        lats[name].extend(lat)
                        trips[name].append(sent / n)
                        errors[name] += err
                        cmds[name] = {k: round(v / n, 3) for k, v in _delta(before, after).items()}
                ratio = round_ratio(rates, "netlimit", "limits")
                p = {name: (_pct(v, 50) * 1e3, _pct(v, 99) * 1e3) for name, v in lats.items()}
                rt = {name: median(v) for name, v in trips.items()}
                case = f"{alg}, {clients} client{'s' if clients > 1 else ''}"
                sec.rows.append(
                    row(
                        case,
                        median(rates["netlimit"]),
                        median(rates["limits"]),
                        unit="decisions/s",
                        peer_name=f"limits {PEERS[alg]} (async redis-py)",
                        ratio=ratio,
                        goal=f">= {GOAL:g}x, 1 round trip",
                        met=ratio >= GOAL
                        and abs(rt["netlimit"] - 1) < 0.01
                        and abs(cmds["netlimit"].get("evalsha", 0) - 1) < 0.01,
                        note=(
                            f"{_p50_p99(p, 'limits')}; round trips/decision "
                            f"{rt['netlimit']:.2f} vs {rt['limits']:.2f}"
                            + (
                                f" (netlimit: {cmds['netlimit'].get('evalsha', 0):.2f} EVALSHA, "
                                f"{median(writes):.2f} socket writes per decision)"
                                if writes
                                else ""
                            )
                        ),
                        p50_ms=p["netlimit"][0],
                        p99_ms=p["netlimit"][1],
                        peer_p50_ms=p["limits"][0],
                        peer_p99_ms=p["limits"][1],
                        round_trips=rt["netlimit"],
                        peer_round_trips=rt["limits"],
                    )
                )
                if "limits_sync" in rates:
                    sync_ratio = round_ratio(rates, "netlimit", "limits_sync")
                    sec.rows.append(
                        row(
                            f"{case}, vs sync limits",
                            median(rates["netlimit"]),
                            median(rates["limits_sync"]),
                            unit="decisions/s",
                            peer_name=f"limits {PEERS[alg]} (sync redis-py)",
                            ratio=sync_ratio,
                            goal="reference",
                            met=None,
                            note=f"{_p50_p99(p, 'limits_sync')}; a blocking client, measured in the same rounds "
                            "(it would stall an asyncio sidecar)",
                            p50_ms=p["netlimit"][0],
                            p99_ms=p["netlimit"][1],
                            peer_p50_ms=p["limits_sync"][0],
                            peer_p99_ms=p["limits_sync"][1],
                        )
                    )
                sec.details[case] = {
                    "rates": {k: [round(x) for x in v] for k, v in rates.items()},
                    "commands_per_decision": cmds,
                    "errors": errors,
                    "netlimit_socket_writes_per_decision": round(median(writes), 3) if writes else None,
                }
    finally:
        counter.close()
        await nl_store.close()
        try:
            await lm_storage.storage.aclose()
        except Exception:  # best effort
            pass
        try:
            sync_storage.storage.close()
        except Exception:  # best effort
            pass


def run(mode: Mode) -> Section:
    sec = Section("redis", "Redis decisions/s and latency: netlimit RedisStore vs limits async RedisStorage")
    import uvloop

    with redis_server("nlbench-redis-") as (port, _proc), asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_bench(port, mode, sec))
    sec.details["what"] = __doc__.split("\n\n", 1)[1].strip()
    return sec
