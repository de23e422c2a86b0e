"""gRPC front door benchmark: Envoy's ShouldRateLimit against a real
``netlimit sidecar --grpc`` process, memory store and Redis store.

    python -m bench.grpc_bench [--quick] [--json]

One client channel (one HTTP/2 connection, as Envoy keeps to its rate limit
cluster) carries 16 concurrent streams; every call is one decision (one
descriptor, 1000 client addresses round robin, a token bucket they stay
under).  The two stores' sidecars run side by side and are measured in
alternating rounds, so machine noise hits both alike; decisions/s is the
median over rounds, p50/p99 are over every call.  The client is Python too
(grpc.aio), so the figures are a floor for what Envoy (C++) would see.  A
``grpc.health.v1`` Check on the memory sidecar is measured the same way as
the ceiling of the gRPC stack itself (no decision).

Only loopback; every process is killed in a finally; every loop is bounded
by time.  ``run(quick)`` returns a dict (see its docstring).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

STREAMS = 16
KEYS = 1000
CONFIG = """\
version: 1
http:
  domain: bench
  descriptors:
    - key: remote_address
      rate_limit: {unit: second, requests_per_unit: 1000}
      algorithm: token_bucket
"""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _netlimit_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "netlimit"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "netlimit.cli"]


class _Proc:
    """A child process with its stderr drained by a thread (lines kept, bounded)."""

    def __init__(self, argv: list[str]):
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, bufsize=1)
        self.lines: list[str] = []
        self._cv = threading.Condition()
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._cv:
                if len(self.lines) < 1000:
                    self.lines.append(line.rstrip("\n"))
                self._cv.notify_all()
        with self._cv:
            self._cv.notify_all()

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                for line in self.lines:
                    m = rx.search(line)
                    if m:
                        return m
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise RuntimeError(
                        f"no line matching {pattern!r} (exit {self.proc.poll()}): " + "\n".join(self.lines[-20:])
                    )
                self._cv.wait(min(left, 0.2))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


def _start_redis(tmp: Path) -> tuple[_Proc | None, str | None, str]:
    exe = (
        os.environ.get("NETLIMIT_REDIS_SERVER")
        or shutil.which("redis-server")
        or ("/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None)
    )
    if exe is None:
        return None, None, "redis-server is not installed (apt-get install redis-server)"
    port = _free_port()
    p = _Proc(
        [
            exe,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(tmp),
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
            "--daemonize",
            "no",
        ]
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return p, f"redis://127.0.0.1:{port}/0", ""
        except OSError:
            time.sleep(0.05)
    p.stop()
    return None, None, "redis-server did not answer PING within 10 s"


def _start_sidecar(config: Path, redis_url: str | None) -> tuple[_Proc, int]:
    argv = [*_netlimit_cmd(), "sidecar", "--config", str(config), "--listen", "127.0.0.1:0", "--grpc", "127.0.0.1:0"]
    if redis_url:
        argv += ["--redis", redis_url]
    p = _Proc(argv)
    try:
        port = int(p.wait_for(r"gRPC listening on 127\.0\.0\.1:(\d+)", 20).group(1))
    except BaseException:
        p.stop()
        raise
    return p, port


async def _round(stub_call, make_request, seconds: float, lat: list[float]) -> tuple[int, int, float]:
    """STREAMS workers call back to back for ``seconds``: (calls, errors, elapsed)."""
    import grpc

    done = 0
    errors = 0
    end = time.perf_counter() + seconds

    async def worker(w: int) -> None:
        nonlocal done, errors
        i = w
        perf = time.perf_counter
        while True:
            t = perf()
            if t >= end:
                return
            try:
                await stub_call(make_request(i), timeout=5)
            except grpc.aio.AioRpcError:
                errors += 1
            lat.append(perf() - t)
            done += 1
            i += STREAMS

    t0 = time.perf_counter()
    await asyncio.gather(*[worker(w) for w in range(STREAMS)])
    return done, errors, time.perf_counter() - t0


async def _measure(targets: dict[str, int], rounds: int, seconds: float) -> dict[str, Any]:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from netlimit.rls.proto import envoy_ratelimit_pb2, rls_pb2, rls_pb2_grpc

    D = envoy_ratelimit_pb2.RateLimitDescriptor
    reqs = [
        rls_pb2.RateLimitRequest(
            domain="bench", descriptors=[D(entries=[D.Entry(key="remote_address", value=f"10.0.{k // 250}.{k % 250}")])]
        )
        for k in range(KEYS)
    ]
    health_req = health_pb2.HealthCheckRequest(service="")
    channels = {name: grpc.aio.insecure_channel(f"127.0.0.1:{port}") for name, port in targets.items()}
    calls: dict[str, Any] = {}
    makers: dict[str, Any] = {}
    for name, ch in channels.items():
        if name == "health":
            calls[name] = health_pb2_grpc.HealthStub(ch).Check
            makers[name] = lambda i: health_req
        else:
            calls[name] = rls_pb2_grpc.RateLimitServiceStub(ch).ShouldRateLimit
            makers[name] = lambda i: reqs[i % KEYS]
    try:
        for name in calls:  # connect and warm up
            await _round(calls[name], makers[name], min(0.5, seconds), [])
        rates: dict[str, list[float]] = {n: [] for n in calls}
        lats: dict[str, list[float]] = {n: [] for n in calls}
        totals = {n: [0, 0] for n in calls}
        names = list(calls)
        for r in range(rounds):
            order = names if r % 2 == 0 else names[::-1]
            for name in order:
                n, err, el = await _round(calls[name], makers[name], seconds, lats[name])
                rates[name].append(n / el)
                totals[name][0] += n
                totals[name][1] += err
    finally:
        for ch in channels.values():
            await ch.close()
    out = {}
    for name in calls:
        xs = sorted(lats[name])

        def pct(p: float) -> float:
            return round(xs[min(len(xs) - 1, int(p / 100 * len(xs)))] * 1000, 3) if xs else float("nan")

        out[name] = {
            "decisions_per_s" if name != "health" else "calls_per_s": round(statistics.median(rates[name])),
            "rounds": [round(x) for x in rates[name]],
            "p50_ms": pct(50),
            "p99_ms": pct(99),
            "calls": totals[name][0],
            "errors": totals[name][1],
        }
    return out


def run(quick: bool) -> dict:
    """Measure; returns::

    {"streams": 16, "keys": 1000, "rounds": R, "seconds_per_round": S,
     "memory": {"decisions_per_s", "rounds", "p50_ms", "p99_ms", "calls", "errors"},
     "redis":  {... same ...} or {"skipped": reason},
     "health": {"calls_per_s", ...},      # gRPC stack ceiling, no decision
     "cpus": N, "loadavg": [1, 5, 15 min] before the run}
    """
    rounds, seconds = (3, 1.0) if quick else (5, 4.0)
    load = [round(x, 2) for x in os.getloadavg()]
    procs: list[_Proc] = []
    with tempfile.TemporaryDirectory(prefix="netlimit-grpc-bench-") as d:
        tmp = Path(d)
        cfg = tmp / "bench.yaml"
        cfg.write_text(CONFIG)
        try:
            mem, mem_port = _start_sidecar(cfg, None)
            procs.append(mem)
            targets = {"memory": mem_port}
            redis, url, why = _start_redis(tmp)
            if redis is not None:
                procs.append(redis)
                rs, rs_port = _start_sidecar(cfg, url)
                procs.append(rs)
                targets["redis"] = rs_port
            targets["health"] = mem_port
            results = asyncio.run(_measure(targets, rounds, seconds))
        finally:
            for p in reversed(procs):
                p.stop()
    if "redis" not in results:
        results["redis"] = {"skipped": why}
    return {
        "streams": STREAMS,
        "keys": KEYS,
        "rounds": rounds,
        "seconds_per_round": seconds,
        "cpus": os.cpu_count(),
        "loadavg": load,
        **results,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="gRPC ShouldRateLimit decisions/s and latency, memory and Redis")
    ap.add_argument("--quick", action="store_true", help="3 rounds of 1 s instead of 5 of 4 s")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)
    res = run(args.quick)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(
        f"gRPC ShouldRateLimit, {res['streams']} concurrent streams on one connection, "
        f"{res['rounds']} rounds x {res['seconds_per_round']} s, {res['cpus']} CPUs, "
        f"load average {res['loadavg'][0]} before the run"
    )
    print(f"{'store':<8} {'decisions/s':>12} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}")
    for name in ("memory", "redis", "health"):
        r = res[name]
        if "skipped" in r:
            print(f"{name:<8} skipped: {r['skipped']}")
            continue
        rate = r.get("decisions_per_s", r.get("calls_per_s"))
        label = name if name != "health" else "(health)"
        print(f"{label:<8} {rate:>12} {r['p50_ms']:>8} {r['p99_ms']:>8} {r['errors']:>7}")
    print("(health) = grpc.health.v1 Check on the memory sidecar: the gRPC stack alone, no decision")
    return 0


if __name__ == "__main__":
    sys.exit(main())
