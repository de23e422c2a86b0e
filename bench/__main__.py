"""netlimit benchmarks, side by side with the tools users would pick instead.

    python -m bench --quick            # small sizes, about a minute (results in bench/results/quick/)
    python -m bench                    # the full sizes (about 15 minutes)
    python -m bench --only redis,cluster  # some sections (merged into the existing results)

Writes ``<out>/latest.json``, ``<out>/latest.md`` and, when matplotlib is
installed, ``<out>/kernel_apply.png`` (default out: bench/results, or bench/results/quick with --quick).  Needs
root for the kernel and accuracy sections (they create network namespaces
and delete them; nothing runs in the machine's own namespace), and
redis-server, nginx, wrk, iperf3, iptables-legacy (scripts/setup.sh installs
them).  Not part of the test suite's pass/fail.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

from .common import REPO, Mode, Section

SECTIONS = (
    "inproc",
    "redis",
    "leases",
    "cluster",
    "http",
    "workers",
    "memory",
    "kernel",
    "accuracy",
    "simulate",
    "bans",
)
MODULES = {
    "inproc": "inproc",
    "redis": "redis_bench",
    "leases": "lease_bench",
    "cluster": "cluster_bench",
    "http": "http_bench",
    "workers": "workers_bench",
    "memory": "memory",
    "kernel": "kernel_apply",
    "accuracy": "accuracy",
    "simulate": "simulate_bench",
    "bans": "ban_restart",
}


def _machine() -> dict:
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    import subprocess

    rev = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    return {
        "python": platform.python_version(),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "loadavg_at_start": load,
        "git": rev or None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, seconds per section")
    ap.add_argument(
        "--out",
        default=None,
        help="directory for latest.json/.md/.png (default bench/results; with --quick bench/results/quick, "
        "so a quick run never overwrites the committed full-run results)",
    )
    ap.add_argument("--only", default="", help=f"comma-separated sections of {','.join(SECTIONS)}")
    args = ap.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()] or list(SECTIONS)
    bad = [s for s in only if s not in SECTIONS]
    if bad:
        ap.error(f"unknown section(s) {', '.join(bad)}; expected {', '.join(SECTIONS)}")
    results = REPO / "bench" / "results"
    out = Path(args.out) if args.out else (results / "quick" if args.quick else results)
    out.mkdir(parents=True, exist_ok=True)
    mode = Mode(quick=args.quick)
    doc: dict = {}
    latest = out / "latest.json"
    if args.only and latest.exists():
        doc = json.loads(latest.read_text())
    doc.setdefault("sections", {})
    doc["mode"] = "quick" if args.quick else "full"
    doc["machine"] = _machine()
    from .versions import peers, pins

    doc["peers"] = peers()  # what this run measured against (each section keeps its own copy)
    doc["pins"] = pins()
    doc["started"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    t_all = time.perf_counter()
    import importlib

    failed = False
    for name in only:
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            sec: Section = importlib.import_module(f".{MODULES[name]}", __package__).run(mode)
        except Exception as exc:  # reported in the results, the run goes on
            failed = True
            traceback.print_exc()
            sec = Section(name, name, error=f"{type(exc).__name__}: {exc}")
        sec.seconds = time.perf_counter() - t0
        doc["sections"][name] = sec.to_json() | {"peers": doc["peers"]}
        print(
            f"[bench] {name}: {sec.seconds:.1f} s{' (FAILED: ' + sec.error + ')' if sec.error else ''}",
            file=sys.stderr,
            flush=True,
        )
    doc["seconds"] = round(time.perf_counter() - t_all, 1)
    tmp = out / "latest.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1, default=float) + "\n")
    os.replace(tmp, latest)
    from .report import markdown, plot

    png = plot(doc, out)
    (out / "latest.md").write_text(markdown(doc, png))
    print(markdown(doc, png))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
