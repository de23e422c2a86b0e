"""Decision endpoint throughput, before vs after a change, in one run (issue 29:
the per-rule memory budget must cost <= 5 %): two ``netlimit sidecar``
processes on the same config, one importing the tree at ``--before`` (e.g. the
main checkout), one this tree; ``wrk`` (1 thread, 8 connections) against
``GET /v1/check`` of each in interleaved rounds, the median requests/s compared.

Two cases:

* ``one key``: every request the same client (the hot path: a key already held);
* ``new keys``: a wrk Lua script sends a new ``X-Api-Key`` per request under a
  rule whose budget (``max_keys: 2000``) is far smaller than the keys sent, so
  nearly every request inserts a state and the generations rotate (the path the
  budget changed).

    PYTHONPATH=$PWD .venv/bin/python -m bench.budget_ab --before /work/main [--rounds 7] [--seconds 2] [--inproc]

Requests/s swing by 2x between rounds on a busy host; the sidecar's CPU time
per request (from /proc) is reported beside them, and ``--inproc`` measures the
decision alone (``Limiter.check_fast``, the minimum over rounds).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from .common import free_port, median, stop, wait_port

CONFIG = """\
version: 1
http:
  domain: bench
  max_keys: 2000
  actions:
    - [remote_address]
    - [header:X-Api-Key]
  descriptors:
    - key: remote_address
      rate_limit: {unit: second, requests_per_unit: 100000000}
    - key: "header:X-Api-Key"
      rate_limit: {unit: minute, requests_per_unit: 1000}
"""

NEW_KEYS_LUA = """\
local n = 0
request = function()
  n = n + 1
  return wrk.format("GET", nil, {["X-Api-Key"] = string.format("k%d-%d", math.random(1, 1000000000), n)})
end
"""


def sidecar(tree: str, cfg: Path, port: int, log: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=tree)
    fh = open(log, "w")
    try:
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "netlimit.cli",
                "sidecar",
                "--config",
                str(cfg),
                "--listen",
                f"127.0.0.1:{port}",
                "--log-level",
                "error",
            ],
            stdout=subprocess.DEVNULL,
            stderr=fh,
            env=env,
            cwd=tree,
        )
    finally:
        fh.close()
    wait_port(port, p)
    return p


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (/proc/PID/stat), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_wrk(url: str, seconds: float, pid: int, script: Path | None = None) -> tuple[float, float]:
    """(requests/s, CPU microseconds the sidecar spent per request) of one wrk run.
    On a loaded host the second is the steadier figure: it does not count the
    time the sidecar waited for a core."""
    cmd = ["wrk", "-t1", "-c8", f"-d{max(1, round(seconds))}s"]
    if script is not None:
        cmd += ["-s", str(script)]
    c0 = cpu_seconds(pid)
    out = subprocess.run(cmd + [url], capture_output=True, text=True, timeout=seconds + 30).stdout
    c1 = cpu_seconds(pid)
    rps = n = None
    for line in out.splitlines():
        if line.startswith("Requests/sec:"):
            rps = float(line.split()[1])
        if " requests in " in line:
            n = int(line.split()[0])
    if rps is None or not n:
        raise RuntimeError(f"wrk: {out}")
    return rps, (c1 - c0) / n * 1e6


#: the decision itself, in a child process of each tree: ``Limiter.check_fast`` (what
#: /v1/check calls) on one key, or on a new key each call past the rule's budget;
#: the fastest of 5 passes over 200k decisions (the minimum resists a busy host)
_INPROC = r"""
import sys, time
from netlimit.config.validate import load_string
from netlimit.limit.limiter import Limiter
from netlimit.limit.rules import from_loaded
lim = Limiter(from_loaded(load_string(sys.argv[2], "b.yaml")))
N = 200_000
if sys.argv[1] == "one key":
    descs = [[[("remote_address", "10.0.0.1")]]] * N
else:
    descs = [[[("header:X-Api-Key", f"k{i}")]] for i in range(N)]
cf = lim.check_fast
best = 1e9
for rep in range(5):
    t0 = time.process_time()
    for d in descs:
        cf(d)
    best = min(best, time.process_time() - t0)
print(best / N * 1e9)
"""


def inproc(before: str, after: str, rounds: int) -> dict:
    ns: dict[str, dict[str, list[float]]] = {"one key": {}, "new keys": {}}
    for r in range(rounds):
        for case in ns:
            for name, tree in (("before", before), ("after", after))[:: 1 if r % 2 == 0 else -1]:
                out = subprocess.run(
                    [sys.executable, "-c", _INPROC, case, CONFIG],
                    capture_output=True,
                    text=True,
                    timeout=600,
                    env=dict(os.environ, PYTHONPATH=tree),
                    cwd=tree,
                ).stdout
                ns[case].setdefault(name, []).append(float(out))
    return {
        case: {
            "ns per decision before, after (min of rounds)": [round(min(by["before"])), round(min(by["after"]))],
            "throughput after/before": round(min(by["before"]) / min(by["after"]), 3),
        }
        for case, by in ns.items()
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True, help="the tree to compare against (e.g. /work/main)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--inproc", action="store_true", help="the decision in-process only (no HTTP, no wrk)")
    a = ap.parse_args()
    after = str(Path(__file__).resolve().parent.parent)
    if a.inproc:
        print(json.dumps(inproc(a.before, after, a.rounds), indent=1))
        return 0
    with tempfile.TemporaryDirectory(prefix="nl-budget-ab-") as d:
        cfg = Path(d) / "n.yaml"
        cfg.write_text(CONFIG)
        lua = Path(d) / "new.lua"
        lua.write_text(NEW_KEYS_LUA)
        procs = []
        try:
            ports = {}
            for name, tree in (("before", a.before), ("after", after)):
                ports[name] = free_port()
                procs.append(sidecar(tree, cfg, ports[name], Path(d) / f"{name}.log"))
            urls = {n: f"http://127.0.0.1:{p}/v1/check" for n, p in ports.items()}
            pids = {"before": procs[0].pid, "after": procs[1].pid}
            scripts = {"one key": None, "new keys": lua}
            for name, u in urls.items():  # warm-up
                for sc in scripts.values():
                    run_wrk(u, 1, pids[name], sc)
            rates: dict[str, dict[str, list[tuple[float, float]]]] = {c: {} for c in scripts}
            load0 = os.getloadavg()[0]
            for r in range(a.rounds):
                order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
                for case, sc in scripts.items():
                    for name in order:
                        rates[case].setdefault(name, []).append(run_wrk(urls[name], a.seconds, pids[name], sc))
            out: dict = {"rounds": a.rounds, "seconds": a.seconds, "load": [load0, os.getloadavg()[0]]}
            for case, by in rates.items():
                rb, ra = [x[0] for x in by["before"]], [x[0] for x in by["after"]]
                cb, ca = [x[1] for x in by["before"]], [x[1] for x in by["after"]]
                out[case] = {
                    "requests/s before, after (medians)": [round(median(rb)), round(median(ra))],
                    "requests/s after/before (median of rounds)": round(median([x / y for x, y in zip(ra, rb)]), 3),
                    "CPU us per request before, after (medians)": [round(median(cb), 1), round(median(ca), 1)],
                    "throughput from CPU after/before": round(median(cb) / median(ca), 3),
                }
            print(json.dumps(out, indent=1))
            return 0
        finally:
            for p in procs:
                stop(p)


if __name__ == "__main__":
    sys.exit(main())
