#!/usr/bin/env python3
"""What `method: recent` admits under the legacy backend (xt_recent's sliding hit log)
and under nftables (a bucket of N per period per address plus a ban every attempt
renews, nft/compile.py), measured with real TCP connections between namespaces.

Run as root from the repository (2-3 minutes; every scenario runs at once, each
backend in its own pair of namespaces nlrc-<pid>-<n>-{s,c}, deleted at the end):

    .venv/bin/python scripts/recent_vs_nft.py [--json results.json] [--scale 1.0]

Rule: tcp/2222, new connections, 3/minute per source. Each attempt is one SYN
(connect with a 0.15 s timeout: no SYN retransmission, so one hit per attempt) at a
fixed time. --scale shrinks every time (period and schedule) for a quick look.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from netlimit.config.validate import load_string
from netlimit.kernel import reconcile, traffic
from netlimit.kernel.compile import compile_config

SRV, CLI = "198.18.0.1", "198.18.0.2"
PORT = 2222
TIMEOUT = 0.15

# (name, attempt times in seconds at scale 1, what it stands for)
SCENARIOS = [
    (
        "burst-then-every-5s",
        [0.15 * i for i in range(5)] + [5.0 * i for i in range(1, 13)],
        "5 in 1 s, then one every 5 s",
    ),
    ("every-15s", [15.0 * i for i in range(9)], "one every 15 s (4/minute: just over the limit)"),
    ("every-25s", [25.0 * i for i in range(5)], "one every 25 s (2.4/minute: under the limit)"),
    (
        "burst-pause-burst",
        [0.15 * i for i in range(5)] + [65 + 0.15 * i for i in range(5)],
        "5 in 1 s, 64 s quiet, 5 in 1 s",
    ),
]


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


def rules(period: int) -> str:
    limit = "3/minute" if period == 60 else f"3/{period}s"
    return f"""
version: 1
network:
  - name: knock
    protocol: tcp
    ports: [{PORT}]
    new_connections: true
    limit: {limit}
    method: recent
"""


def run_one(backend: str, name: str, times: list[float], scale: float, base: str, out: dict) -> None:
    srv, cli = f"{base}-s", f"{base}-c"
    try:
        sh("ip", "netns", "add", srv)
        sh("ip", "netns", "add", cli)
        sh("ip", "link", "add", "s0", "netns", srv, "type", "veth", "peer", "name", "c0", "netns", cli)
        for ns, dev, addr in ((srv, "s0", SRV), (cli, "c0", CLI)):
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
        period = max(1, round(60 * scale))
        d = compile_config(load_string(rules(period), "<recent>").config)
        reconcile.apply(d, srv, backend=backend)
        horizon = max(times) * scale + 5
        lst = traffic.tcp_listener(srv, SRV, PORT, seconds=horizon + 10)
        got: list[bool] = []
        try:
            t0 = time.monotonic()
            for t in times:
                delay = t0 + t * scale - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                got += traffic.tcp_connects(cli, CLI, SRV, PORT, 1, timeout=TIMEOUT)
        finally:
            lst.kill()
            lst.wait()
        out[(backend, name)] = got
    finally:
        for ns in (srv, cli):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--scale", type=float, default=1.0, help="shrink every time by this factor (period included)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("recent_vs_nft: run as root (it creates network namespaces)", file=sys.stderr)
        return 64
    results: dict[tuple[str, str], list[bool]] = {}
    threads = []
    for k, (backend, (name, times, _what)) in enumerate((b, s) for b in ("restore", "nftables") for s in SCENARIOS):
        base = f"nlrc-{os.getpid()}-{k}"
        th = threading.Thread(target=run_one, args=(backend, name, times, args.scale, base, results), daemon=True)
        threads.append(th)
        th.start()
    for th in threads:
        th.join(timeout=400)

    def mark(got: list[bool]) -> str:
        return " ".join("ok" if x else "x" for x in got)

    print(f"method: recent, 3 per {60 * args.scale:g} s, tcp new connections; ok = accepted, x = dropped")
    rows = []
    for name, times, what in SCENARIOS:
        r, n = results.get(("restore", name)), results.get(("nftables", name))
        print(f"\n{name}: {what} ({len(times)} attempts)")
        print(f"  recent (restore)   {sum(r) if r else '?':>2} accepted: {mark(r) if r else 'did not run'}")
        print(f"  nftables           {sum(n) if n else '?':>2} accepted: {mark(n) if n else 'did not run'}")
        rows.append(
            {
                "scenario": name,
                "what": what,
                "times_s": [round(t * args.scale, 2) for t in times],
                "recent": r,
                "nftables": n,
            }
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"scale": args.scale, "rows": rows}, indent=2) + "\n")
    return 0 if all(results.get((b, s[0])) is not None for b in ("restore", "nftables") for s in SCENARIOS) else 1


if __name__ == "__main__":
    sys.exit(main())
