"""netlimitd restarting with a large ban list (issue 35): seconds from the daemon's start
to READY=1 (sd_notify) and to every ban in its kernel, with the list in a real Redis.

Runs scripts/ban_drills.py's ready drill (its fleet of namespaces, nftables backend).
The peer is netlimit before issue 35 (afb45aa), whose figures cannot be made again from
this tree: they are the ones measured beside the new ones in one session, on the same
host (docs/reliability.md, "Restarts with many bans").
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from .common import PY, REPO, Mode, Section, row

GOAL_S = 1.5
#: afb45aa, 100,000 bans, nftables (docs/reliability.md): READY=1 came before the list
#: was loaded; the bans were in the kernel this long after the start
BEFORE = {"ready_s": 0.97, "bans_in_kernel_s": 8.8}


def run(mode: Mode) -> Section:
    n = mode.pick(20_000, 100_000)
    sec = Section("bans", f"netlimitd restart with {n:,} bans in Redis: start -> READY=1 and -> bans in the kernel")
    with tempfile.TemporaryDirectory(prefix="netlimit-bench-bans-") as d:
        out = Path(d) / "drills.json"
        p = subprocess.run(
            [PY, str(REPO / "scripts" / "ban_drills.py"), "--only", "ready", "--bans", str(n), "--backend", "nftables",
             "--json", str(out)],
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        if not out.exists():
            raise RuntimeError(f"ban_drills.py failed ({p.returncode}): {(p.stdout + p.stderr)[-2000:]}")
        r = json.loads(out.read_text())["results"][0]["ready"]
    sec.details = {"ready": r}
    peer = "netlimit afb45aa (before issue 35; 100,000 bans, measured beside it, docs/reliability.md)"
    sec.rows.append(
        row(
            f"start -> every ban in the kernel, {n:,} bans",
            r["bans_in_kernel_s"],
            BEFORE["bans_in_kernel_s"] if n == 100_000 else None,
            unit="s",
            better="lower",
            peer_name=peer,
            goal=f"<= {GOAL_S:g} s",
            met=r["bans_in_kernel_s"] <= GOAL_S,
        )
    )
    sec.rows.append(
        row(
            f"start -> READY=1, {n:,} bans",
            r["ready_s"],
            BEFORE["ready_s"] if n == 100_000 else None,
            unit="s",
            better="lower",
            peer_name=peer,
            goal=f"<= {GOAL_S:g} s, after the bans are in the kernel",
            met=r["ready_s"] <= GOAL_S and r["in_kernel_at_ready"] == n,
            note=f"{r['in_kernel_at_ready']:,} bans in the kernel when READY=1 came (the old one came before the load)",
        )
    )
    return sec
