#!/usr/bin/env python3
"""Leased quota, the 60 s runs of issue 33 (the 4 s versions are in
tests/limit/test_leases.py): 4 processes (tests/helpers/lease_worker.py, one
LeasedRedisStore each, as 4 sidecars) on one hot key of a redis-server of this
script's own, fixed_window 1,000 per 1 s window.

    .venv/bin/python scripts/lease_soak.py [--seconds 60] [--json bench/results/lease_60s.json]

twice: the 4 together at 2x the limit: every window admits at most the limit,
    and the full windows (>= 1.5x the limit asked) exactly the limit.
nine_tenths: at 0.9x the limit: denials (early ones: quota held in another
    process's lease) at most 1 % of the requests.

Figures printed (and written with --json) with the load average before and
after; exit 1 when a bound is broken.  Every process is killed in a finally.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.common import redis_server  # noqa: E402 - after the sys.path entry

WORKER = REPO / "tests" / "helpers" / "lease_worker.py"
LIMIT, PERIOD, PROCS = 1000, 1.0, 4


def run_workers(url: str, total_rate: float, seconds: float) -> tuple[dict[int, list[int]], int]:
    """Every window's [attempts, admitted] over the processes, and their store errors
    (denials: on_store_failure closed)."""
    prefix = f"soak{uuid.uuid4().hex[:8]}"
    start = time.time() + 2.0
    argv = [sys.executable, str(WORKER), url, prefix, str(LIMIT), str(PERIOD), str(total_rate / PROCS), str(start),
            str(seconds), "1"]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in range(PROCS)
    ]
    total: dict[int, list[int]] = {}
    errors = 0
    try:
        for p in procs:
            out, err = p.communicate(timeout=seconds + 60)
            if p.returncode != 0:
                raise RuntimeError(f"worker failed ({p.returncode}): {err[-2000:]}")
            errors += sum(int(x.split()[-1]) for x in err.splitlines() if x.startswith("store errors "))
            for w, (a, b) in json.loads(out.strip().splitlines()[-1]).items():
                c = total.setdefault(int(w), [0, 0])
                c[0] += a
                c[1] += b
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return total, errors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args()
    out: dict = {"limit": LIMIT, "period_s": PERIOD, "processes": PROCS, "seconds": args.seconds}
    ok = True
    with redis_server("nlsoak-") as (port, _proc):
        url = f"redis://127.0.0.1:{port}/0"
        for name, factor in (("twice", 2.0), ("nine_tenths", 0.9)):
            load0 = os.getloadavg()[0]
            t, errors = run_workers(url, factor * LIMIT, args.seconds)
            load1 = os.getloadavg()[0]
            attempts = sum(a for a, _ in t.values())
            admitted = sum(b for _, b in t.values())
            over = {w: b - LIMIT for w, (a, b) in t.items() if b > LIMIT}
            full = [w for w, (a, _) in t.items() if a >= 1.5 * LIMIT]
            short = {w: t[w][1] for w in full if t[w][1] != LIMIT}
            denied = attempts - admitted
            r = {
                "rate": factor * LIMIT,
                "windows": len(t),
                "requests": attempts,
                "admitted": admitted,
                "denied": denied,
                "denied_pct": round(100 * denied / max(1, attempts), 3),
                "store_errors": errors,  # timeouts of a loaded host: denied (on_store_failure closed)
                "windows_over_limit": over,
                "full_windows": len(full),
                "full_windows_not_exactly_the_limit": short,
                "max_admitted_in_a_window": max((b for _, b in t.values()), default=0),
                "loadavg": [round(load0, 2), round(load1, 2)],
            }
            out[name] = r
            print(f"{name} ({factor}x the limit, {args.seconds:g} s): {json.dumps(r)}")
            ok = ok and not over
            if name == "twice":
                ok = ok and not short and bool(full)
            else:
                ok = ok and r["denied_pct"] <= 1.0
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    print("bounds held" if ok else "A BOUND WAS BROKEN")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
