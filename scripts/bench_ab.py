"""The benchmark of two source trees in one run: before/after figures of a change.

    python scripts/bench_ab.py before=/path/to/old/tree after=. [--rounds 3] [--only inproc,redis,kernel]

Runs ``python -m bench --quick --only SECTIONS`` from each tree in turn (``PYTHONPATH=TREE``,
the order alternating every round, so load drifts hit both alike), then prints, per case,
the median of netlimit's figure over the rounds for each tree and after/before, and the
same for the ratio to the peer measured beside it (limits, iptables-legacy-restore, nft),
which cancels most of the host's drift.  A ratio of 1.00 is "unchanged"; > 1 is better
for ``after`` whatever the unit (times are inverted).  The decision endpoint has its own
A/B (scripts/decision_ab.py, with nginx beside).  Results: ``--out`` (default a temp dir).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def _run(tree: Path, only: str, out: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, "-m", "bench", "--quick", "--only", only, "--out", str(out)]
    r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise SystemExit(f"bench failed in {tree} (exit {r.returncode}):\n{r.stderr[-2000:]}")
    return json.loads((out / "latest.json").read_text())


def _rows(doc: dict) -> dict[tuple[str, str], dict]:
    return {(s, row["case"]): row for s, sec in doc["sections"].items() for row in sec.get("rows") or []}


def _better(row: dict, a: float, b: float) -> float:
    """after/before as 'how much better': inverted for times."""
    return (b / a if row.get("better") == "higher" else a / b) if a and b else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs=2, metavar="NAME=PATH")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default="inproc,redis,kernel")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    names, paths = zip(*(t.split("=", 1) for t in a.trees))
    out = a.out or Path(tempfile.mkdtemp(prefix="nl-bench-ab-"))
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(a.rounds):
        order = list(zip(names, paths))
        for name, path in order if r % 2 == 0 else reversed(order):
            print(f"round {r + 1}/{a.rounds}: {name}", file=sys.stderr, flush=True)
            runs[name].append(_rows(_run(Path(path).resolve(), a.only, out / f"{name}-{r}")))
    before, after = names
    print(f"{'case':<70} {before:>12} {after:>12} {'after/before':>12} {'vs peer':>8}")
    for key, row in runs[before][0].items():
        vals = {n: [x[key]["netlimit"] for x in runs[n] if key in x and x[key].get("netlimit")] for n in names}
        rat = {n: [x[key]["ratio"] for x in runs[n] if key in x and x[key].get("ratio")] for n in names}
        if not vals[before] or not vals[after]:
            continue
        mb, ma = statistics.median(vals[before]), statistics.median(vals[after])
        peer = (
            f"{statistics.median(rat[after]) / statistics.median(rat[before]):8.2f}"
            if rat[before] and rat[after]
            else f"{'-':>8}"
        )
        print(f"{key[0] + ': ' + key[1]:<70.70} {mb:12.4g} {ma:12.4g} {_better(row, mb, ma):12.2f} {peer}")
    print(f"(medians of {a.rounds} rounds; results in {out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
