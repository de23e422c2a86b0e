"""Shared pieces of the benchmark sections: the size presets, side-by-side
interleaved timing, result rows, free ports, bounded child processes.

Every figure a section reports is measured beside its peer in the same run,
interleaved round by round where the two can alternate, because the machine
is shared and noisy: the ratios (median of the per-round ratios) are the
figures to trust, the absolute numbers only describe this run.
"""

from __future__ import annotations

import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable


@dataclass
class Mode:
    """Sizes for one run (``--quick`` or full)."""

    quick: bool

    def pick(self, quick: Any, full: Any) -> Any:
        return quick if self.quick else full


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def row(
    case: str,
    netlimit: float | None,
    peer: float | None,
    *,
    unit: str,
    peer_name: str,
    better: str = "higher",
    goal: str = "",
    met: bool | None = None,
    note: str = "",
    ratio: float | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """One comparison: netlimit's figure, the peer's, their ratio (netlimit / peer
    for "higher is better", peer / netlimit for "lower is better" -- so a ratio
    above 1 always means netlimit is ahead), the goal and whether it was met."""
    if ratio is None and netlimit is not None and peer is not None and netlimit > 0 and peer > 0:
        ratio = netlimit / peer if better == "higher" else peer / netlimit
    r = {
        "case": case,
        "netlimit": netlimit,
        "peer": peer,
        "peer_name": peer_name,
        "unit": unit,
        "better": better,
        "ratio": ratio,
        "goal": goal,
        "met": met,
        "note": note,
    }
    r.update(extra)
    return r


def interleaved_rates(
    runners: dict[str, Callable[[int], tuple[int, float]]],
    rounds: int,
) -> dict[str, Any]:
    """Run each runner once per round, alternating (and reversing the order every
    other round so that neither always goes first).  A runner takes the round
    number and returns (operations, seconds).  Returns per-runner rates of every
    round and their medians (see round_ratio for the ratios)."""
    names = list(runners)
    rates: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        order = names if r % 2 == 0 else list(reversed(names))
        for n in order:
            ops, secs = runners[n](r)
            rates[n].append(ops / secs if secs > 0 else float("nan"))
    return {"rates": rates, "median": {n: median(v) for n, v in rates.items()}}


def round_ratio(rates: dict[str, list[float]], a: str, b: str) -> float:
    """Median over rounds of rates[a] / rates[b] (both measured in the same round)."""
    return median([x / y for x, y in zip(rates[a], rates[b]) if y > 0])


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen | None, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} before listening on {port}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")
            time.sleep(0.02)


def stop(proc: subprocess.Popen | None, timeout: float = 5.0) -> None:
    """Terminate a child we started (then kill it) and reap it."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def need(tool: str, apt: str | None = None) -> str:
    path = shutil.which(tool) or (f"/usr/sbin/{tool}" if os.path.exists(f"/usr/sbin/{tool}") else None)
    if not path:
        raise RuntimeError(f"{tool} is not installed (apt-get install {apt or tool}); scripts/setup.sh installs it")
    return path


@dataclass
class Section:
    """What a section returns: rows for the table plus anything else worth keeping."""

    name: str
    title: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "rows": self.rows,
            "details": self.details,
            "seconds": round(self.seconds, 2),
            "error": self.error,
        }
