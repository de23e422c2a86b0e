"""The decision endpoint of two source trees beside nginx ``limit_req``, in one run.

    python scripts/decision_ab.py before=/path/to/old/tree after=. [--rounds 11] [--seconds 2]

bench/http_bench.py's decision section (its nginx config, its sidecar rules, wrk
with one thread and 8 connections), with a sidecar started from each tree
(``PYTHONPATH=TREE``) and the rounds interleaved, the order rotated every
round; ratios are taken per round and their median printed.  Everything
listens on 127.0.0.1 and is stopped in ``finally``.

Placement is bench/http_bench.py's by default: the scheduler places every
server and wrk (as it does nginx and the sidecar in production), so this
script's ratio and the bench table's measure the same thing.  ``--pin`` puts
each server (nginx, and each sidecar with all its threads) on CPU
``--server-cpu`` and wrk on ``--client-cpu`` (taskset): steadier, but not the
fair comparison — every request then crosses CPUs, which costs the
latency-bound nginx far more than the CPU-bound sidecar (2026-11-28, 2 CPUs:
nginx 40k req/s pinned vs 100k unpinned, the sidecar 21k vs 39k; ratio 0.52
pinned vs 0.38 unpinned in the same hour).  ``--no-pin`` is accepted (the default).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import free_port, need, stop, wait_port
from bench.http_bench import SIDECAR_YAML, _nginx_conf, wrk


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs=2, metavar="NAME=PATH")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--server-cpu", type=int, default=0)
    ap.add_argument("--client-cpu", type=int, default=1)
    ap.add_argument("--no-pin", action="store_true", help="let the scheduler place servers and wrk (the default)")
    ap.add_argument(
        "--pin", action="store_true", help="servers on --server-cpu, wrk on --client-cpu (kinder to netlimit)"
    )
    a = ap.parse_args()
    pinned = a.pin and not a.no_pin
    pin = ["taskset", "-c", str(a.server_cpu)] if pinned else []
    cpu = a.client_cpu if pinned else None
    trees = dict(t.split("=", 1) for t in a.trees)
    exe = Path(sys.executable).with_name("netlimit")
    d = Path(tempfile.mkdtemp(prefix="nl-ab-"))
    procs: list[subprocess.Popen] = []
    try:
        pl, ps = free_port(), free_port()
        (d / "nginx.conf").write_text(_nginx_conf(d, pl, ps))
        (d / "n.yaml").write_text(SIDECAR_YAML)
        ng = subprocess.Popen([*pin, need("nginx", "nginx-light"), "-p", str(d), "-c", str(d / "nginx.conf")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        procs.append(ng)
        wait_port(pl, ng)
        urls = {"nginx": f"http://127.0.0.1:{pl}/v1/check"}
        for name, tree in trees.items():
            port = free_port()
            env = dict(os.environ, PYTHONPATH=str(Path(tree).resolve()))
            argv = [*pin, str(exe), "sidecar", "--config", str(d / "n.yaml"), "--listen", f"127.0.0.1:{port}"]
            with open(d / f"{name}.log", "w") as log:
                p = subprocess.Popen([*argv, "--log-level", "warning"], env=env, stdout=subprocess.DEVNULL, stderr=log)
            procs.append(p)
            wait_port(port, p, timeout=90)
            urls[name] = f"http://127.0.0.1:{port}/v1/check"
        hdr = {"X-Original-URI": "/"}
        for u in urls.values():  # warm-up
            wrk(u, 8, 1, hdr, cpu)
        names = list(urls)
        res: dict[str, list[float]] = {n: [] for n in names}
        la0 = os.getloadavg()[0]
        for r in range(a.rounds):
            for n in names[r % len(names) :] + names[: r % len(names)]:
                res[n].append(wrk(urls[n], 8, a.seconds, hdr, cpu)["rps"])
        la1 = os.getloadavg()[0]
        where = "unpinned" if not pinned else f"servers on CPU {a.server_cpu}, wrk on CPU {a.client_cpu}"
        print(
            f"load average {la0:.1f} -> {la1:.1f}; {a.rounds} rounds of {a.seconds:g} s, 8 connections, "
            f"wrk -t1; {where}"
        )
        for n in names:
            print(f"{n:8s} median {statistics.median(res[n]):9.0f} requests/s, rounds {[round(x) for x in res[n]]}")
        for n in names[1:]:
            rat = [x / y for x, y in zip(res[n], res["nginx"])]
            print(f"{n}/nginx: median of per-round ratios {statistics.median(rat):.3f} "
                  f"(rounds {min(rat):.2f}-{max(rat):.2f})")  # fmt: skip
        b, c = names[1], names[2]
        print(f"{c}/{b}: median of per-round ratios {statistics.median(x / y for x, y in zip(res[c], res[b])):.3f}")
    finally:
        for p in procs:
            stop(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
