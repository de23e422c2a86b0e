"""Section: `netlimit sidecar --workers N`, 1 vs 2 workers beside nginx 1 vs 2.

``wrk`` against ``GET /v1/check`` of the sidecar (memory store shared by the
workers through the state owner, netlimit/limit/stores/shared.py) with 1 and 2
workers, and against an nginx location with ``limit_req`` (one zone in shared
memory, ``nodelay``) answering 200 with ``worker_processes`` 1 and 2; every
request is admitted on both sides.  All wrk connections come from 127.0.0.1:
one client address, one hot key -- the case the workers must share exactly.

The sidecar's rule is Lyft's fixed window (the default algorithm: its hot keys
lease quota from the owner); two more sidecars measure the design's
alternatives at 2 workers: the same rule with leases off (one round trip to the
owner per decision, ``NETLIMIT_SHARED_LEASES=0``) and the sliding window
counter (an algorithm that does not lease: a round trip per decision).

wrk: 2 threads, 32 connections (enough to keep 2 workers busy); the targets run
one after the other in each round, the order reversed every other round, and
the ratios are taken per round (their medians reported).  On a 2-core host wrk
takes a core's worth of time itself, so neither side can double: the goals
are relative to nginx's own scaling on the same host in the same rounds.
The goals are judged at 32 connections, the load this section has always used;
full runs then repeat the four main targets at 8 and 128 connections (SWEEP),
rows without a goal: the scaling of both servers moves with wrk's connection
count, and so does their ratio (0.6-1.0 across 8-256 connections on the 2-core
test host, docs/performance.md).

Where the time goes, per target (medians of the rounds): the CPU the server's
processes took (user and system, the kernel's TCP work for its sockets
included) and wrk's, each per request, and the host's idle share during the
run (/proc/stat).  With one worker a server is bound by that worker's core
unless the host sits idle; with two, both cores are busy and a request costs
what the server and wrk together spend on it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .common import Mode, Section, cpu_seconds, door, free_port, median, need, process_tree, row, stop, wait_port
from .http_bench import _nginx_conf, wrk

GOAL_SCALING = 0.8  # netlimit's 2w/1w >= 0.8 x nginx's 2w/1w
GOAL_RATIO = 0.5  # netlimit >= 0.5 x nginx at equal worker counts
RATE = 10_000_000  # per window: nothing is ever limited
CONNS, THREADS = 32, 2
#: the other connection counts full runs measure the scaling at (rows without a goal)
SWEEP = (8, 128)


def _yaml(*extra: str) -> str:
    rule = "".join(f"\n      {line}" for line in extra)
    return (
        "version: 1\nhttp:\n  domain: bench\n  storage: memory\n  actions:\n    - [remote_address]\n"
        "  descriptors:\n    - key: remote_address\n"
        f"      rate_limit: {{unit: minute, requests_per_unit: {RATE}}}{rule}\n"
    )


def _sidecar(cfg: Path, port: int, workers: int, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    exe = Path(sys.executable).parent / "netlimit"
    argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "netlimit.cli"]
    argv += ["sidecar", "--config", str(cfg), "--listen", f"127.0.0.1:{port}", "--log-level", "warning"]
    argv += ["--workers", str(workers)]
    with open(log, "w") as fh:
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=fh, env=env)
    try:
        wait_port(port, p, timeout=60)
    except RuntimeError as exc:
        stop(p)
        raise RuntimeError(f"{exc}: {log.read_text()[-2000:]}") from None
    return p


def run(mode: Mode) -> Section:
    sec = Section("workers", "Sidecar workers (wrk): netlimit --workers 1 vs 2 beside nginx worker_processes 1 vs 2")
    nginx = need("nginx", "nginx-light")
    need("wrk")
    seconds = mode.pick(1, 2)
    rounds = mode.pick(1, 7)
    d = Path(tempfile.mkdtemp(prefix="nlbench-workers-"))
    procs: list[subprocess.Popen] = []
    try:
        urls: dict[str, str] = {}
        pids: dict[str, int] = {}
        for n in (1, 2):
            nd = d / f"nginx{n}"
            nd.mkdir()
            port = free_port()
            (nd / "nginx.conf").write_text(_nginx_conf(nd, port, None, workers=n))
            p = subprocess.Popen([nginx, "-p", str(nd), "-c", str(nd / "nginx.conf")],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
            procs.append(p)
            wait_port(port, p)
            urls[f"nginx{n}"] = f"http://127.0.0.1:{port}/v1/check"
            pids[f"nginx{n}"] = p.pid
        fw, sw = d / "fw.yaml", d / "sw.yaml"
        fw.write_text(_yaml())
        sw.write_text(_yaml("algorithm: sliding_window_counter"))
        door_env, which_door = door(mode, d)
        base = door_env or dict(os.environ)
        plain = {**base, "NETLIMIT_SHARED_LEASES": "0"}
        sidecars = [("netlimit1", fw, 1, base), ("netlimit2", fw, 2, base)]
        if not mode.quick:  # the alternatives: full runs only (--quick stays short)
            sidecars += [("netlimit2_no_leases", fw, 2, plain), ("netlimit2_sliding", sw, 2, base)]
        for name, cfg, n, env in sidecars:
            port = free_port()
            procs.append(_sidecar(cfg, port, n, d / f"{name}.log", env))
            urls[name] = f"http://127.0.0.1:{port}/v1/check"
            pids[name] = procs[-1].pid
        hdr = {"X-Original-URI": "/"}
        for url in urls.values() if not mode.quick else ():  # warm up: connections, first paths, keys hot
            wrk(url, CONNS, 1, hdr)
        load_before = os.getloadavg()
        runs: dict[str, list[dict]] = {k: [] for k in urls}
        names = list(urls)
        for r in range(rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                runs[name].append(_wrk(urls[name], seconds, hdr, pids[name]))
        load_after = os.getloadavg()
        sweep: dict[int, dict[str, list[dict]]] = {}
        core = ("netlimit1", "netlimit2", "nginx1", "nginx2")
        for conns in SWEEP if not mode.quick else ():
            sweep[conns] = {k: [] for k in core}
            for r in range(max(3, rounds // 2)):
                for name in core if r % 2 == 0 else core[::-1]:
                    sweep[conns][name].append(_wrk(urls[name], seconds, hdr, pids[name], conns))
    finally:
        for p in procs:
            stop(p, timeout=15)
        shutil.rmtree(d, ignore_errors=True)
    load = f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after"
    rps = {k: [x["rps"] for x in v] for k, v in runs.items()}
    med = {k: median(v) for k, v in rps.items()}

    def per_round(a: str, b: str) -> list[float]:
        return [x / y for x, y in zip(rps[a], rps[b]) if y > 0]

    nl_scale, ng_scale = per_round("netlimit2", "netlimit1"), per_round("nginx2", "nginx1")
    rel = [a / b for a, b in zip(nl_scale, ng_scale) if b > 0]
    bad = sum(x["non2xx"] for v in runs.values() for x in v)
    sec.rows.append(
        row(
            "2 workers / 1 worker, decision endpoint (scaling)",
            median(nl_scale),
            median(ng_scale),
            unit="x",
            peer_name="nginx limit_req, worker_processes 2 / 1",
            ratio=median(rel),
            goal=f">= {GOAL_SCALING:g}x nginx's scaling",
            met=median(rel) >= GOAL_SCALING,
            note=f"per round: netlimit {', '.join(f'{x:.2f}' for x in nl_scale)}; nginx "
            f"{', '.join(f'{x:.2f}' for x in ng_scale)}; {load}",
        )
    )
    for n in (1, 2):
        ratios = per_round(f"netlimit{n}", f"nginx{n}")
        sec.rows.append(
            row(
                f"decision endpoint, {n} worker{'s' if n > 1 else ''}, wrk -t{THREADS} -c{CONNS}: requests/s",
                med[f"netlimit{n}"],
                med[f"nginx{n}"],
                unit="requests/s",
                peer_name=f"nginx limit_req ({n} worker{'s' if n > 1 else ''})",
                ratio=median(ratios),
                goal=f">= {GOAL_RATIO:g}x",
                met=median(ratios) >= GOAL_RATIO,
                note=f"{which_door}; ratio per round {min(ratios):.2f}-{max(ratios):.2f}; "
                f"non-2xx in all runs: {bad}; {load}",
            )
        )
    for name, what in (
        ()
        if mode.quick
        else (
            ("netlimit2_no_leases", "2 workers, leases off (one round trip to the state owner per decision)"),
            ("netlimit2_sliding", "2 workers, sliding_window_counter (does not lease: one round trip per decision)"),
        )
    ):
        sec.rows.append(
            row(
                f"decision endpoint, {what}: requests/s",
                med[name],
                med["netlimit2"],
                unit="requests/s",
                peer_name="netlimit, 2 workers, fixed_window with leases",
                ratio=median(per_round(name, "netlimit2")),
                note=f"per round {', '.join(f'{x:,.0f}' for x in rps[name])}",
            )
        )
    cpu = {k: {m: median([x[m] for x in v]) for m in ("server_us", "wrk_us", "idle")} for k, v in runs.items()}
    for n in (1, 2):
        a, b = cpu[f"netlimit{n}"], cpu[f"nginx{n}"]
        sec.rows.append(
            row(
                f"CPU per request, {n} worker{'s' if n > 1 else ''}: the server's processes (wrk's in the note)",
                a["server_us"],
                b["server_us"],
                unit="µs",
                better="lower",
                peer_name=f"nginx ({n} worker{'s' if n > 1 else ''})",
                note=f"wrk {a['wrk_us']:.1f} µs beside netlimit, {b['wrk_us']:.1f} beside nginx; host idle "
                f"{a['idle']:.0%} beside netlimit, {b['idle']:.0%} beside nginx",
            )
        )
    for conns, got in sweep.items():
        r_ = {k: [x["rps"] for x in v] for k, v in got.items()}
        nl = [a / b for a, b in zip(r_["netlimit2"], r_["netlimit1"]) if b > 0]
        ng = [a / b for a, b in zip(r_["nginx2"], r_["nginx1"]) if b > 0]
        rel_ = [a / b for a, b in zip(nl, ng) if b > 0]
        sec.rows.append(
            row(
                f"2 workers / 1 worker, decision endpoint (scaling), wrk -t{THREADS} -c{conns}",
                median(nl),
                median(ng),
                unit="x",
                peer_name="nginx limit_req, worker_processes 2 / 1",
                ratio=median(rel_),
                note=f"no goal: the goal is judged at -c{CONNS}; per round {', '.join(f'{x:.2f}' for x in rel_)}; "
                + "; ".join(f"{k} {median(v):,.0f}/s" for k, v in r_.items()),
            )
        )
        sec.details.setdefault("sweep_rps_per_round", {})[conns] = r_
    sec.details["cpu_per_request"] = cpu
    sec.details["rps_per_round"] = rps
    sec.details["load_average"] = {"before": load_before, "after": load_after}
    sec.details["what"] = __doc__.split("\n\n", 1)[1].strip()
    return sec


def _wrk(url: str, seconds: float, hdr: dict[str, str], server: int, conns: int = CONNS) -> dict:
    """wrk with THREADS threads (http_bench.wrk runs one; 2 workers need two clients' worth)
    and ``conns`` connections, and the CPU the server's processes (``server``'s tree) and
    wrk took per request."""
    import re

    cmd = [need("wrk"), f"-t{THREADS}", f"-c{conns}", f"-d{max(1, round(seconds))}s", "--timeout", "5s"]
    for k, v in hdr.items():
        cmd += ["-H", f"{k}: {v}"]
    tree = process_tree(server)
    s0, w0, h0 = cpu_seconds(tree), _children_cpu(), _host()
    p = subprocess.run([*cmd, url], capture_output=True, text=True, timeout=seconds + 30)
    s1, w1, h1 = cpu_seconds(tree), _children_cpu(), _host()
    if p.returncode != 0:
        raise RuntimeError(f"wrk failed: {p.stderr.strip() or p.stdout.strip()}")
    m = re.search(r"Requests/sec:\s+([\d.]+)", p.stdout)
    total = re.search(r"(\d+) requests in", p.stdout)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", p.stdout)
    n = max(1, int(total.group(1)) if total else 1)
    return {
        "rps": float(m.group(1)) if m else 0.0,
        "non2xx": int(non2xx.group(1)) if non2xx else 0,
        "server_us": (s1 - s0) / n * 1e6,
        "wrk_us": (w1 - w0) / n * 1e6,
        "idle": (h1[0] - h0[0]) / max(1, h1[1] - h0[1]),
    }


def _children_cpu() -> float:
    """Seconds of CPU of this process's waited-for children (wrk, once it has ended)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _host() -> tuple[int, int]:
    """(idle, all) jiffies of the host's CPUs so far (/proc/stat)."""
    with open("/proc/stat") as fh:
        f = [int(x) for x in fh.readline().split()[1:8]]
    return f[3], sum(f)


if __name__ == "__main__":
    s = run(Mode(quick="--quick" in sys.argv))
    for r in s.rows:
        print(
            f"{r['case']}: {r['netlimit']:,.2f} vs {r['peer']:,.2f} {r['unit']} "
            f"(ratio {r['ratio']:.2f}; goal {r['goal'] or '-'}; met {r['met']}); {r['note']}"
        )
