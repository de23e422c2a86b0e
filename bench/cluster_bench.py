"""Section "cluster": decisions/s at 16 clients through a Redis Cluster of three
primaries (no replicas), side by side with the same store on one redis-server,
with a one-primary cluster (every slot on one node: the cost of routing by
slot alone, the same server batching as one server), and with redis-py's
``redis.asyncio.cluster.RedisCluster`` running the same Lua (netlimit's
RedisStore given that client: EVALSHA with the store's script, SCRIPT LOAD on
NOSCRIPT).  The five redis-server processes are started by this section on
free loopback ports (killed in ``finally``).

All three sides run on one uvloop event loop in this process, with the same key
stream (10,000 keys, limit 1,000/minute, so admissions), taking turns in short
rounds (full: 30 of 0.25 s, the order reversed every round); a ratio is the
median of the per-round ratios (see redis_bench.py for why).  The host has two
cores shared by the client and every server, so a cluster cannot be faster
than one server here: the goal is that routing by slot costs little per
decision (>= 0.9x of one server) and that the lean client keeps its lead over
redis-py's cluster client (>= 2x).  CPU time per decision is reported beside
the rates (the client process, and the servers' utime + stime from /proc): on
this shared host it is steadier than the rates, and it shows where a
three-primary cluster's cost goes (16 commands in flight split three ways:
smaller batches per server, more reads and writes per decision).

Round trips: the commands netlimit's cluster client handed to its connections
per decision (each has one reply), and the servers' ``INFO commandstats``
(EVALSHA and everything else) summed over the primaries, per decision.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import time
from typing import Any

from netlimit.limit.algorithms import FIXED_WINDOW, TOKEN_BUCKET

from .common import Mode, Section, free_ports, median, need, round_ratio, row, stop, wait_port
from .inproc import LIMIT, key_stream
from .redis_bench import _drive, _pct

GOAL_SINGLE = 0.9
GOAL_REDISPY = 2.0
ALGORITHMS = (FIXED_WINDOW, TOKEN_BUCKET)  # Lyft's default, and the usual API bucket


def _server(exe: str, port: int, d: str, bus: int | None) -> subprocess.Popen:
    args = [exe, "--port", str(port), "--bind", "127.0.0.1", "--dir", d, "--save", "", "--appendonly", "no",
            "--protected-mode", "no", "--daemonize", "no"]  # fmt: skip
    if bus is not None:
        args += ["--cluster-enabled", "yes", "--cluster-config-file", f"{d}/nodes.conf", "--cluster-port", str(bus)]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait_cluster(ports: list[int], timeout: float = 30.0) -> None:
    import redis

    deadline = time.monotonic() + timeout
    while True:
        ok = True
        for p in ports:
            c = redis.Redis(port=p, socket_timeout=2)
            try:
                info = c.cluster("info")
                ok = ok and info.get("cluster_state") == "ok" and int(info.get("cluster_known_nodes", 0)) == len(ports)
            except redis.RedisError:
                ok = False
            finally:
                c.close()
        if ok:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the benchmark's cluster on {ports} did not come up in {timeout} s")
        time.sleep(0.1)


def _commandstats(ports: list[int]) -> dict[str, int]:
    import redis

    out: dict[str, int] = {}
    for p in ports:
        c = redis.Redis(port=p)
        try:
            for k, v in c.info("commandstats").items():
                name = k.removeprefix("cmdstat_")
                out[name] = out.get(name, 0) + v["calls"]
        finally:
            c.close()
    return out


def _cpu(pids: list[int]) -> float:
    """utime + stime of processes, in seconds."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / tick


class _Run:
    """What one configuration measured over its rounds."""

    def __init__(self, names: list[str]) -> None:
        self.rates: dict[str, list[float]] = {n: [] for n in names}
        self.lats: dict[str, list[float]] = {n: [] for n in names}
        self.client_us: dict[str, list[float]] = {n: [] for n in names}
        self.server_us: dict[str, list[float]] = {n: [] for n in names}
        self.errors = dict.fromkeys(names, 0)
        self.trips: list[float] = []
        self.writes: list[float] = []
        self.cmds: dict[str, dict[str, float]] = {}

    def p(self, name: str) -> tuple[float, float]:
        return _pct(self.lats[name], 50) * 1e3, _pct(self.lats[name], 99) * 1e3

    def cpu(self, name: str) -> tuple[float, float]:
        return median(self.client_us[name]), median(self.server_us[name])

    def note(self, a: str, b: str) -> str:
        pa, pb, ca, cb = self.p(a), self.p(b), self.cpu(a), self.cpu(b)
        return (
            f"p50/p99 ms {pa[0]:.2f}/{pa[1]:.2f} vs {pb[0]:.2f}/{pb[1]:.2f}; CPU us/decision client+servers "
            f"{ca[0]:.1f}+{ca[1]:.1f} vs {cb[0]:.1f}+{cb[1]:.1f}"
        )


async def _measure(sides: dict, servers: dict, stores: dict, cports: list[int], stream: list[str], clients: int,
                   rounds: int) -> _Run:  # fmt: skip
    run = _Run(list(sides))
    names = list(sides)
    cl = stores["cluster"].client
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            before = _commandstats(cports) if name in ("cluster", "redispy") else None
            c0, w0 = cl.commands_sent, cl.writes
            s0, p0 = _cpu(servers[name]), time.process_time()
            n, secs, lat, err = await _drive(sides[name], stream, clients, 0.25)
            run.client_us[name].append((time.process_time() - p0) / n * 1e6)
            run.server_us[name].append((_cpu(servers[name]) - s0) / n * 1e6)
            run.rates[name].append(n / secs)
            run.lats[name].extend(lat)
            run.errors[name] += err
            if before is not None:
                after = _commandstats(cports)
                run.cmds[name] = {
                    k: round((after.get(k, 0) - before.get(k, 0)) / n, 3)
                    for k in after
                    if after.get(k, 0) - before.get(k, 0) > 0 and k != "info"
                }
            if name == "cluster":
                run.trips.append((cl.commands_sent - c0) / n)
                run.writes.append((cl.writes - w0) / n)
    return run


async def _bench(single: tuple[int, int], one: tuple[int, int], three: list[tuple[int, int]], mode: Mode,
                 sec: Section) -> None:  # fmt: skip
    """``single``, ``one`` (a one-primary cluster) and ``three`` are (port, pid)."""
    from redis.asyncio.cluster import RedisCluster

    from netlimit.limit.algorithms import Limit
    from netlimit.limit.stores import RedisStore

    limits = [Limit(alg, LIMIT, 60.0) for alg in ALGORITHMS]
    cports = [p for p, _ in three]
    stores = {
        "cluster": RedisStore(f"redis+cluster://127.0.0.1:{cports[0]},127.0.0.1:{cports[1]}/", timeout_ms=2000),
        "single": RedisStore(f"redis://127.0.0.1:{single[0]}/0", timeout_ms=2000),
        "cluster1": RedisStore(f"redis+cluster://127.0.0.1:{one[0]}/", timeout_ms=2000),
    }
    rp_client = RedisCluster(host="127.0.0.1", port=cports[0])
    await rp_client.initialize()
    stores["redispy"] = RedisStore(rp_client, timeout_ms=2000)
    servers = {"cluster": [pid for _, pid in three], "redispy": [pid for _, pid in three], "single": [single[1]],
               "cluster1": [one[1]]}  # fmt: skip
    for name in ("cluster", "single", "cluster1"):
        await stores[name].start()
        await stores[name].load_scripts(*limits)
    _, stream = key_stream(10_000, mode.pick(20_000, 100_000), seed=3)
    rounds = mode.pick(2, 30)
    try:
        for lim in limits[: mode.pick(1, len(limits))]:
            sides = {}
            for name, store in stores.items():

                async def decide(k: str, store=store, lim=lim) -> Any:
                    return await store.hit(k, lim)

                await decide("warm")
                sides[name] = decide
            run = await _measure(sides, servers, stores, cports, stream, 16, rounds)
            _rows(sec, run, f"{lim.algorithm}, 16 clients")
            if not mode.quick:
                # the same at 64 clients: bigger batches per server (a reference row)
                two = {n: sides[n] for n in ("cluster", "single")}
                run64 = await _measure(two, servers, stores, cports, stream, 64, rounds)
                ratio = round_ratio(run64.rates, "cluster", "single")
                sec.rows.append(
                    row(
                        f"{lim.algorithm}, 64 clients: 3-primary cluster vs one server",
                        median(run64.rates["cluster"]),
                        median(run64.rates["single"]),
                        unit="decisions/s",
                        peer_name="netlimit RedisStore on one redis-server",
                        ratio=ratio,
                        goal="reference",
                        met=None,
                        note=run64.note("cluster", "single"),
                    )
                )
    finally:
        for name, store in stores.items():
            if name != "redispy":
                await store.close()
        await rp_client.aclose()


def _rows(sec: Section, run: _Run, case: str) -> None:
    rt = median(run.trips)
    evalsha = run.cmds.get("cluster", {}).get("evalsha", 0.0)
    one_trip = abs(rt - 1) < 0.01 and abs(evalsha - 1) < 0.01
    ps, pc = run.p("single"), run.p("cluster")
    vs_single = round_ratio(run.rates, "cluster", "single")
    sec.rows.append(
        row(
            f"{case}: 3-primary cluster vs one server",
            median(run.rates["cluster"]),
            median(run.rates["single"]),
            unit="decisions/s",
            peer_name="netlimit RedisStore on one redis-server",
            ratio=vs_single,
            goal=f">= {GOAL_SINGLE:g}x, 1 round trip",
            met=vs_single >= GOAL_SINGLE and one_trip,
            note=f"{run.note('cluster', 'single')}; round trips/decision {rt:.2f} ({evalsha:.2f} EVALSHA; "
            f"commands on the primaries per decision {run.cmds.get('cluster')}); socket writes/decision "
            f"{median(run.writes):.2f}",
            p50_ms=pc[0],
            p99_ms=pc[1],
            peer_p50_ms=ps[0],
            peer_p99_ms=ps[1],
            round_trips=rt,
            client_us=run.cpu("cluster")[0],
            server_us=run.cpu("cluster")[1],
            peer_client_us=run.cpu("single")[0],
            peer_server_us=run.cpu("single")[1],
        )
    )
    vs_one = round_ratio(run.rates, "cluster1", "single")
    sec.rows.append(
        row(
            f"{case}: 1-primary cluster (routing by slot alone) vs one server",
            median(run.rates["cluster1"]),
            median(run.rates["single"]),
            unit="decisions/s",
            peer_name="netlimit RedisStore on one redis-server",
            ratio=vs_one,
            goal=f">= {GOAL_SINGLE:g}x",
            met=vs_one >= GOAL_SINGLE,
            note=run.note("cluster1", "single"),
            client_us=run.cpu("cluster1")[0],
            server_us=run.cpu("cluster1")[1],
            peer_client_us=run.cpu("single")[0],
            peer_server_us=run.cpu("single")[1],
        )
    )
    vs_redispy = round_ratio(run.rates, "cluster", "redispy")
    pr = run.p("redispy")
    sec.rows.append(
        row(
            f"{case}: netlimit cluster client vs redis-py RedisCluster",
            median(run.rates["cluster"]),
            median(run.rates["redispy"]),
            unit="decisions/s",
            peer_name="redis.asyncio.cluster.RedisCluster, the same Lua",
            ratio=vs_redispy,
            goal=f">= {GOAL_REDISPY:g}x",
            met=vs_redispy >= GOAL_REDISPY,
            note=f"{run.note('cluster', 'redispy')}; redis-py's commands on the primaries per decision "
            f"{run.cmds.get('redispy')}",
            p50_ms=pc[0],
            p99_ms=pc[1],
            peer_p50_ms=pr[0],
            peer_p99_ms=pr[1],
        )
    )
    sec.details[case] = {
        "rates": {k: [round(x) for x in v] for k, v in run.rates.items()},
        "cpu_us_per_decision": {
            k: {"client": round(run.cpu(k)[0], 2), "servers": round(run.cpu(k)[1], 2)} for k in run.rates
        },
        "errors": run.errors,
        "commands_per_decision": run.cmds,
    }


def run(mode: Mode) -> Section:
    sec = Section("cluster", "Redis Cluster decisions/s: 3 primaries vs one server vs redis-py RedisCluster")
    exe = need("redis-server")
    cli = need("redis-cli", "redis-tools")
    import redis
    import uvloop

    dirs = [tempfile.mkdtemp(prefix="nlbench-cluster-") for _ in range(5)]
    # one server; a one-primary cluster; three cluster nodes; the four bus ports
    ports = free_ports(9)
    procs: list[subprocess.Popen] = []
    try:
        procs.append(_server(exe, ports[0], dirs[0], None))
        for p, d, bus in zip(ports[1:5], dirs[1:], ports[5:]):
            procs.append(_server(exe, p, d, bus))
        for p, proc in zip(ports, procs):
            wait_port(p, proc)
        c = redis.Redis(port=ports[1])
        try:
            c.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        finally:
            c.close()
        cports = ports[2:5]
        subprocess.run(
            [cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in cports), "--cluster-replicas", "0",
             "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        _wait_cluster([ports[1]])
        _wait_cluster(cports)
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(
                _bench(
                    (ports[0], procs[0].pid),
                    (ports[1], procs[1].pid),
                    [(p, proc.pid) for p, proc in zip(cports, procs[2:])],
                    mode,
                    sec,
                )
            )
    finally:
        for proc in procs:
            stop(proc)
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
    sec.details["what"] = __doc__.split("\n\n", 1)[1].strip()
    return sec
