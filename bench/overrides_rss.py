"""Distinct limit overrides vs the sidecar's memory and Redis' script cache
(issue 29, item 8): a real redis-server and a real ``netlimit sidecar --redis``
(decision mode), N JSON requests ``POST /v1/check`` each with an override of its
own numbers (requests_per_unit i, across the five algorithms), one keep-alive
connection.  Prints the sidecar's RSS before and after (after one warm-up
round of 500 overrides, so imports and first-use caches are in "before") and
Redis' ``number_of_cached_scripts`` / ``used_memory_scripts``.

    PYTHONPATH=$PWD .venv/bin/python -m bench.overrides_rss [N] [--memory]

Goal: 30,000 overrides -> RSS +<= 10 MiB, number_of_cached_scripts <= 20.
"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import free_port, stop, wait_port

CONFIG = """\
version: 1
http:
  domain: api
  storage: {storage}
  descriptors:
    - key: fw
      rate_limit: {{unit: minute, requests_per_unit: 100}}
    - key: tb
      algorithm: token_bucket
      rate_limit: {{unit: minute, requests_per_unit: 100}}
    - key: lb
      algorithm: leaky_bucket
      rate_limit: {{unit: minute, requests_per_unit: 100}}
    - key: swl
      algorithm: sliding_window_log
      rate_limit: {{unit: minute, requests_per_unit: 100}}
    - key: swc
      algorithm: sliding_window_counter
      rate_limit: {{unit: minute, requests_per_unit: 100}}
"""
KEYS = ("fw", "tb", "lb", "swl", "swc")


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+) kB", f.read()).group(1)) * 1024


def redis_info(port: int) -> dict[str, str]:
    out = subprocess.run(
        ["redis-cli", "-p", str(port), "INFO", "memory"], capture_output=True, text=True, timeout=10
    ).stdout
    return dict(line.split(":", 1) for line in out.splitlines() if ":" in line)


def send(conn: http.client.HTTPConnection, i: int) -> int:
    body = {
        "domain": "api",
        "descriptors": [
            {
                "entries": [{"key": KEYS[i % 5], "value": "client"}],
                "limit": {"requestsPerUnit": 1000 + i, "unit": "HOUR"},
            }
        ],
    }
    conn.request("POST", "/v1/check", json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    r.read()
    return r.status


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv and argv[0].isdigit() else 30_000
    memory = "--memory" in argv
    redis_server = shutil.which("redis-server")
    if redis_server is None:
        print("redis-server is needed (apt-get install redis-server)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="nl-ovrss-") as d:
        rport, sport = free_port(), free_port()
        redis = subprocess.Popen(
            [redis_server, "--port", str(rport), "--bind", "127.0.0.1", "--save", "", "--dir", d],
            stdout=subprocess.DEVNULL,
        )
        sc = None
        try:
            wait_port(rport, redis)
            cfg = Path(d) / "n.yaml"
            cfg.write_text(CONFIG.format(storage="memory" if memory else f"redis://127.0.0.1:{rport}/0"))
            sc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "netlimit.cli",
                    "sidecar",
                    "--config",
                    str(cfg),
                    "--listen",
                    f"127.0.0.1:{sport}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=open(Path(d) / "sidecar.log", "w"),
            )
            wait_port(sport, sc)
            conn = http.client.HTTPConnection("127.0.0.1", sport, timeout=10)
            for i in range(500):  # warm-up: imports, first-use caches, the override cache's first rules
                assert send(conn, 10_000_000 + i) in (200, 429)
            time.sleep(0.5)
            before = rss(sc.pid)
            t0 = time.monotonic()
            for i in range(n):
                status = send(conn, i)
                assert status in (200, 429), status
            took = time.monotonic() - t0
            time.sleep(0.5)
            after = rss(sc.pid)
            info = redis_info(rport)
            out = {
                "overrides": n,
                "store": "memory" if memory else "redis",
                "seconds": round(took, 1),
                "rss_before_mib": round(before / 2**20, 1),
                "rss_after_mib": round(after / 2**20, 1),
                "rss_growth_mib": round((after - before) / 2**20, 2),
                "redis_number_of_cached_scripts": int(info.get("number_of_cached_scripts", "-1")),
                "redis_used_memory_scripts": int(info.get("used_memory_scripts", info.get("used_memory_lua", "-1"))),
            }
            print(json.dumps(out))
            return 0 if out["rss_growth_mib"] <= 10 and out["redis_number_of_cached_scripts"] <= 20 else 1
        finally:
            stop(sc)
            stop(redis)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
