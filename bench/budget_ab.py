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

    PYTHONPATH=$PWD .venv/bin/python -m bench.budget_ab --before /work/main [--rounds 7] [--seconds 2]
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
from .http_bench import wrk

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


def wrk_script(url: str, script: Path, seconds: float) -> float:
    out = subprocess.run(
        ["wrk", "-t1", "-c8", f"-d{max(1, round(seconds))}s", "-s", str(script), url],
        capture_output=True,
        text=True,
        timeout=seconds + 30,
    ).stdout
    for line in out.splitlines():
        if line.startswith("Requests/sec:"):
            return float(line.split()[1])
    raise RuntimeError(f"wrk: {out}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True, help="the tree to compare against (e.g. /work/main)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=2.0)
    a = ap.parse_args()
    after = str(Path(__file__).resolve().parent.parent)
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
            for u in urls.values():  # warm-up
                wrk(u, 8, 1)
                wrk_script(u, lua, 1)
            rates: dict[str, dict[str, list[float]]] = {"one key": {}, "new keys": {}}
            load0 = os.getloadavg()[0]
            for r in range(a.rounds):
                order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
                for name in order:
                    rates["one key"].setdefault(name, []).append(wrk(urls[name], 8, a.seconds)["rps"])
                    rates["new keys"].setdefault(name, []).append(wrk_script(urls[name], lua, a.seconds))
            out = {"rounds": a.rounds, "seconds": a.seconds, "load": [load0, os.getloadavg()[0]]}
            for case, by in rates.items():
                b, f = median(by["before"]), median(by["after"])
                ratios = [x / y for x, y in zip(by["after"], by["before"])]
                out[case] = {
                    "before_rps": round(b),
                    "after_rps": round(f),
                    "after/before (median of rounds)": round(median(ratios), 3),
                    "per round": [round(x, 3) for x in ratios],
                }
            print(json.dumps(out, indent=1))
            return 0
        finally:
            for p in procs:
                stop(p)


if __name__ == "__main__":
    sys.exit(main())
