"""Section simulate: ``netlimit simulate`` replaying a generated combined log
(bench/access_log.py: a day, thousands of clients, a few abusers, a diurnal
rate) through a two-rule file, beside GoAccess parsing the same file.

Each round runs both as child processes, one after the other (the order
reversed every other round): ``netlimit simulate --config two-rules.yaml --json
LOG`` and ``goaccess LOG --log-format=COMBINED -o report.json`` (GoAccess's
JSON report: it parses every line and counts its panels).  Wall time gives
lines/s; ``wait4`` gives each child's CPU time (netlimit's figures helper
included), and each one's process tree is sampled every 20 ms for its memory
(RSS, plus the private pages of netlimit's forked helper).  Both must have
read every line (netlimit's ``requests``, GoAccess's ``valid_requests``).
Memory is shown bounded by replaying a tenth of the log too: the same clients,
a tenth of the lines.

    python -m bench.simulate_bench --picture docs/tuning.png   # the README's picture
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .access_log import write as write_log
from .common import Mode, Section, median, need, process_tree, row

RULES = """\
version: 1
http:
  domain: web
  actions:
    - [remote_address]
    - [path, remote_address]
  descriptors:
    - key: remote_address                 # every client: 10/s, bursts of 20
      rate_limit: {unit: second, requests_per_unit: 10}
      algorithm: token_bucket
      burst: 20
    - key: path                           # logins: 5 a minute per client
      value: /login
      descriptors:
        - key: remote_address
          rate_limit: {unit: minute, requests_per_unit: 5}
          algorithm: sliding_window_log
"""

GOAL = 2.0


def _netlimit() -> list[str]:
    exe = Path(sys.executable).with_name("netlimit")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "netlimit.cli"]


def _memory(pid: int) -> int:
    """A process tree's resident memory, in bytes: the RSS of the process plus the
    private pages of its descendants (a forked helper's shared, copy-on-write pages
    are the parent's, counted once)."""
    total = 0
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if (p == pid and key == "Rss") or (p != pid and key in ("Private_Clean", "Private_Dirty")):
                        total += int(value.split()[0]) * 1024
        except OSError:
            pass
    return total


def _child(argv: list[str], stdout: int | None = subprocess.DEVNULL, timeout: float = 900) -> dict:
    """Run a child to its end: wall seconds, peak memory (of its process tree, sampled
    every 20 ms -- wait4's ru_maxrss would include this process's memory at the fork),
    CPU seconds (wait4), output."""
    out = tempfile.TemporaryFile()
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=out if stdout is None else stdout, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout
    peak = 0
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        peak = max(peak, _memory(p.pid))
        if time.monotonic() > deadline:
            p.kill()
            os.wait4(p.pid, 0)
            raise RuntimeError(f"{argv[0]} ran longer than {timeout} s")
        time.sleep(0.02)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    err = p.stderr.read().decode(errors="replace") if p.stderr else ""
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])} exited with {p.returncode}: {err[-800:]}")
    out.seek(0)
    text = out.read().decode(errors="replace")
    out.close()
    return {"wall": wall, "rss": peak, "cpu": ru.ru_utime + ru.ru_stime, "stdout": text}


def run(mode: Mode) -> Section:
    sec = Section("simulate", "Log replay: netlimit simulate (two rules) vs GoAccess parsing the same log")
    goaccess = need("goaccess")
    n = mode.pick(200_000, 1_000_000)
    rounds = mode.pick(1, 5)
    with tempfile.TemporaryDirectory(prefix="netlimit-bench-sim-") as d:
        tmp = Path(d)
        log = write_log(tmp / "access.log", n)
        small = write_log(tmp / "access-tenth.log", n // 10)
        rules = tmp / "two-rules.yaml"
        rules.write_text(RULES)
        report = tmp / "goaccess.json"
        nl_cmd = [*_netlimit(), "simulate", "--config", str(rules), "--json", "--no-progress"]
        ga_cmd = [goaccess, "--log-format=COMBINED", "--no-global-config", "-o", str(report)]
        runs: dict[str, list[dict]] = {"netlimit": [], "goaccess": []}
        for r in range(rounds):
            order = ["netlimit", "goaccess"] if r % 2 == 0 else ["goaccess", "netlimit"]
            for who in order:
                if who == "netlimit":
                    res = _child([*nl_cmd, str(log)], stdout=None)
                    doc = json.loads(res["stdout"])
                    if doc["requests"] != n:
                        raise RuntimeError(f"netlimit read {doc['requests']} of {n} lines")
                    res["doc"] = {k: doc[k] for k in ("requests", "denied", "unreadable")}
                    res["doc"]["rules"] = [
                        {k: rr[k] for k in ("name", "requests", "denied", "clients", "clients_denied", "peak")}
                        for rr in doc["rules"]
                    ]
                else:
                    res = _child([*ga_cmd, str(log)])
                    general = json.loads(report.read_text())["general"]
                    if general["valid_requests"] != n:
                        raise RuntimeError(f"GoAccess read {general['valid_requests']} of {n} lines")
                res.pop("stdout", None)
                runs[who].append(res)
        ratios = [g["wall"] / m["wall"] for m, g in zip(runs["netlimit"], runs["goaccess"])]
        nl_rate = median([n / x["wall"] for x in runs["netlimit"]])
        ga_rate = median([n / x["wall"] for x in runs["goaccess"]])
        ratio = median(ratios)
        sec.rows.append(
            row(
                f"{n:,}-line combined log, two rules",
                nl_rate,
                ga_rate,
                unit="lines/s",
                peer_name="GoAccess 1.x, same file, JSON report",
                goal=f">= {GOAL:g}x GoAccess",
                met=ratio >= GOAL,
                ratio=ratio,
                note=f"median of {rounds} interleaved round(s); CPU s netlimit "
                f"{median([x['cpu'] for x in runs['netlimit']]):.1f} / GoAccess "
                f"{median([x['cpu'] for x in runs['goaccess']]):.1f}",
            )
        )
        nl_rss = max(x["rss"] for x in runs["netlimit"])
        ga_rss = max(x["rss"] for x in runs["goaccess"])
        sec.rows.append(
            row(
                "peak memory (RSS, and the helper's own pages)",
                nl_rss / 2**20,
                ga_rss / 2**20,
                unit="MiB",
                better="lower",
                peer_name="GoAccess",
                note="Python and its imports included; see the next row for growth with the log",
            )
        )
        tenth = _child([*nl_cmd, str(small)], stdout=None)
        sec.rows.append(
            row(
                f"netlimit peak memory, {n:,} vs {n // 10:,} lines",
                nl_rss / 2**20,
                tenth["rss"] / 2**20,
                unit="MiB",
                better="lower",
                peer_name=f"netlimit on {n // 10:,} lines",
                goal="< 2x for 10x the lines",
                met=nl_rss < 2 * tenth["rss"],
                note="state per active key and a record per client, not per line",
            )
        )
        sec.details["runs"] = runs
        sec.details["what"] = __doc__.split("\n\n", 1)[1].split("\n\n    python")[0].strip()
    return sec


def picture(out: Path, n: int = 200_000) -> None:
    """Render the README's picture: the per-client CDF of the generated log's per-IP rule."""
    import matplotlib

    matplotlib.use("Agg")
    from netlimit.config.validate import load_string
    from netlimit.simulate.report import figure_cdf
    from netlimit.simulate.run import replay

    with tempfile.TemporaryDirectory(prefix="netlimit-picture-") as d:
        log = write_log(Path(d) / "access.log", n)
        res = replay(load_string(RULES, "two-rules.yaml"), [str(log)], progress=False)
    fig = figure_cdf(res.rules[0])
    fig.savefig(out, dpi=100)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--picture":
        picture(Path(sys.argv[2]))
    else:
        print(__doc__)
