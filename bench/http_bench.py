"""Section 3: the sidecar over HTTP, measured with wrk beside nginx.

* Decision endpoint: ``wrk`` against ``GET /v1/check`` of ``netlimit sidecar``
  (memory store, one leaky bucket per client address) and against an nginx
  location with ``limit_req`` (leaky bucket per ``$binary_remote_addr``,
  ``nodelay``) that answers 200: one nginx worker, one sidecar process, the same
  wrk threads and connections, interleaved runs.  Rates are set so that every
  request is admitted (both sides do the full decision, neither sends errors).
* Proxy mode: ``netlimit sidecar --upstream`` in front of an nginx location that
  returns a static 200; wrk with one connection against the upstream directly
  and through the sidecar; the added latency is the difference of the p99s.
  (One connection, so the figure is the time the sidecar adds to a request,
  not queueing behind other requests.)  Every request is parsed by llhttp
  (httptools), on both listeners.

wrk runs with one thread (``-t1``): the machine has two cores and wrk's own
thread competes with the server under test; more wrk threads only steal the
server's core.  The same thread and connection counts are used on both sides,
rounds alternate which side goes first, and ratios are taken per round (the
median is reported, with the spread).  The load average before and after is
recorded: on a shared machine both sides' p99 follow it (nginx's too), so the
p99 goals can only be judged against the peer's p99 of the same run.

Everything listens on 127.0.0.1; nginx runs with a temp prefix; both are
killed in ``finally``.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from .common import Mode, Section, door, free_port, median, need, row, stop, wait_port

GOAL_RATIO = 0.5
GOAL_P99_MS = 2.0
GOAL_ADDED_P99_MS = 1.0
RATE = 100_000  # per second per client address: nothing is ever limited
BURST = 1000

SIDECAR_YAML = f"""\
version: 1
http:
  domain: bench
  storage: memory
  actions:
    - [remote_address]
  descriptors:
    - key: remote_address
      rate_limit: {{unit: second, requests_per_unit: {RATE}}}
      algorithm: leaky_bucket
      burst: {BURST}
"""


def _nginx_conf(d: Path, port_limit: int, port_static: int | None, workers: int | None = None) -> str:
    """nginx ``limit_req`` at RATE/BURST on ``port_limit`` and a static 200 on
    ``port_static`` (None: none); ``workers``: that many worker processes under a
    master (bench/workers_bench.py), else one process without a master."""
    static = (
        f"""
            server {{
                listen 127.0.0.1:{port_static};
                keepalive_requests 100000000;   # never close a benchmark connection (default: 1000)
                location / {{ return 200 "ok\\n"; }}
            }}"""
        if port_static is not None
        else ""
    )
    procs = (
        f"master_process on;\n        worker_processes {workers};"
        if workers
        else "master_process off;\n        worker_processes 1;"
    )
    return textwrap.dedent(f"""\
        daemon off;
        {procs}
        error_log {d}/error.log warn;
        pid {d}/nginx.pid;
        events {{ worker_connections 1024; }}
        http {{
            access_log off;
            client_body_temp_path {d}/body;
            proxy_temp_path {d}/proxy;
            fastcgi_temp_path {d}/fastcgi;
            uwsgi_temp_path {d}/uwsgi;
            scgi_temp_path {d}/scgi;
            limit_req_zone $binary_remote_addr zone=bench:10m rate={RATE}r/s;
            limit_req_status 429;
            server {{
                listen 127.0.0.1:{port_limit};
                keepalive_requests 100000000;
                location / {{
                    limit_req zone=bench burst={BURST} nodelay;
                    return 200;
                }}
            }}{static}
        }}
        """)


_UNIT = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def _ms(text: str) -> float:
    m = re.match(r"([\d.]+)(us|ms|s)$", text)
    if not m:
        raise ValueError(f"wrk latency {text!r}")
    return float(m.group(1)) * _UNIT[m.group(2)]


def wrk(
    url: str, conns: int, seconds: float, headers: dict[str, str] | None = None, cpu: int | None = None
) -> dict[str, float]:
    """wrk with one thread; ``cpu``: pinned to that CPU (taskset), apart from the server's."""
    pin = ["taskset", "-c", str(cpu)] if cpu is not None else []
    cmd = [*pin, need("wrk"), "-t1", f"-c{conns}", f"-d{max(1, round(seconds))}s", "--latency", "--timeout", "5s"]
    for k, v in (headers or {}).items():
        cmd += ["-H", f"{k}: {v}"]
    p = subprocess.run(cmd + [url], capture_output=True, text=True, timeout=seconds + 30)
    if p.returncode != 0:
        raise RuntimeError(f"wrk failed: {p.stderr.strip() or p.stdout.strip()}")
    out = p.stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    pct = {int(a): _ms(b) for a, b in re.findall(r"^\s+(50|75|90|99)%\s+(\S+)", out, re.M)}
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    return {
        "rps": rps,
        "p50_ms": pct[50],
        "p99_ms": pct[99],
        "non2xx": int(non2xx.group(1)) if non2xx else 0,
        "socket_errors": errors.group(1) if errors else "",
    }


def _get(sock: socket.socket, req: bytes) -> None:
    """One request on a keep-alive connection; read the response (Content-Length framed)."""
    sock.sendall(req)
    buf = b""
    while True:
        got = sock.recv(65536)
        if not got:
            raise ConnectionError("closed by the server")
        buf += got
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            break
    m = re.search(rb"\r\ncontent-length:\s*(\d+)", buf[:end].lower())
    want = end + 4 + (int(m.group(1)) if m else 0)
    while len(buf) < want:
        got = sock.recv(65536)
        if not got:
            raise ConnectionError("closed by the server")
        buf += got


def paired_latency(port_a: int, port_b: int, pairs: int) -> tuple[list[float], list[float]]:
    """Milliseconds per request on two keep-alive connections, alternating a, b, a,
    b, ... from one client: both sides meet the same moments of machine load, so
    their difference is the time the second one adds (the client's own cost is in
    both)."""

    def conn(port: int) -> socket.socket:
        c = socket.create_connection(("127.0.0.1", port), timeout=10)
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return c

    ca, cb = conn(port_a), conn(port_b)
    ra, rb = [], []
    req_a = f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port_a}\r\n\r\n".encode()
    req_b = f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port_b}\r\n\r\n".encode()
    clock = time.perf_counter_ns
    try:
        i = 0
        while i < pairs + 200:
            try:
                t0 = clock()
                _get(ca, req_a)
                t1 = clock()
                _get(cb, req_b)
                t2 = clock()
            except ConnectionError:  # a server ended the keep-alive connection: this pair is void
                ca.close()
                cb.close()
                ca, cb = conn(port_a), conn(port_b)
                continue
            i += 1
            if i > 200:  # warm-up
                ra.append((t1 - t0) / 1e6)
                rb.append((t2 - t1) / 1e6)
    finally:
        ca.close()
        cb.close()
    return ra, rb


def _pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def _sidecar(cfg: Path, port: int, log: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    exe = Path(sys.executable).parent / "netlimit"
    argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "netlimit.cli"]
    fh = open(log, "w")
    try:
        p = subprocess.Popen(
            argv + ["sidecar", "--config", str(cfg), "--listen", f"127.0.0.1:{port}", "--log-level", "warning", *extra],
            stdout=subprocess.DEVNULL,
            stderr=fh,
            env=env,
        )
    finally:
        fh.close()
    try:
        wait_port(port, p)
    except RuntimeError as exc:
        stop(p)
        raise RuntimeError(f"{exc}: {log.read_text()[-2000:]}") from None
    return p


def run(mode: Mode) -> Section:
    sec = Section("http", "Sidecar over HTTP (wrk): netlimit sidecar vs nginx limit_req")
    nginx = need("nginx", "nginx-light")
    need("wrk")
    conns = 8
    seconds = mode.pick(1, 2)
    rounds = mode.pick(1, 9)  # many short interleaved rounds: the median ratio resists the host's bursts
    d = Path(tempfile.mkdtemp(prefix="nlbench-http-"))
    procs: list[subprocess.Popen] = []
    try:
        p_limit, p_static, p_dec, p_proxy = free_port(), free_port(), free_port(), free_port()
        (d / "nginx.conf").write_text(_nginx_conf(d, p_limit, p_static))
        cfg = d / "netlimit.yaml"
        cfg.write_text(SIDECAR_YAML)
        ng = subprocess.Popen(
            [nginx, "-p", str(d), "-c", str(d / "nginx.conf")], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        procs.append(ng)
        wait_port(p_limit, ng)
        wait_port(p_static, ng)
        env, which_door = door(mode, d)
        procs.append(_sidecar(cfg, p_dec, d / "sidecar.log", env=env))
        procs.append(
            _sidecar(
                cfg,
                p_proxy,
                d / "proxy.log",
                "--upstream",
                f"http://127.0.0.1:{p_static}",
                "--admin-listen",
                "127.0.0.1:0",
                env=env,
            )
        )
        hdr = {"X-Original-URI": "/"}
        dec_url, ng_url = f"http://127.0.0.1:{p_dec}/v1/check", f"http://127.0.0.1:{p_limit}/v1/check"
        # warm both (connections, first-request paths)
        wrk(dec_url, conns, 1, hdr)
        wrk(ng_url, conns, 1, hdr)
        wrk(f"http://127.0.0.1:{p_proxy}/", 1, 1)
        load_before = os.getloadavg()
        runs: dict[str, list[dict]] = {"netlimit": [], "nginx": [], "direct": [], "proxy": []}
        for r in range(rounds):
            pair = [("netlimit", dec_url), ("nginx", ng_url)]
            for name, url in pair if r % 2 == 0 else pair[::-1]:
                runs[name].append(wrk(url, conns, seconds, hdr))
        for r in range(rounds):
            pair = [("direct", f"http://127.0.0.1:{p_static}/"), ("proxy", f"http://127.0.0.1:{p_proxy}/")]
            for name, url in pair if r % 2 == 0 else pair[::-1]:
                runs[name].append(wrk(url, 1, seconds))
        load_after = os.getloadavg()
        load = f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after"
        med = {k: {m: median([x[m] for x in v]) for m in ("rps", "p50_ms", "p99_ms")} for k, v in runs.items()}
        ratios = [a["rps"] / b["rps"] for a, b in zip(runs["netlimit"], runs["nginx"])]
        ratio = median(ratios)
        spread = f"ratio per round {min(ratios):.2f}-{max(ratios):.2f}"
        bad = sum(x["non2xx"] for v in runs.values() for x in v)
        nl, ngx = med["netlimit"], med["nginx"]
        sec.rows.append(
            row(
                f"decision endpoint, {conns} connections: requests/s",
                nl["rps"],
                ngx["rps"],
                unit="requests/s",
                peer_name="nginx limit_req (1 worker)",
                ratio=ratio,
                goal=f">= {GOAL_RATIO:g}x",
                met=ratio >= GOAL_RATIO,
                note=f"{which_door}; {spread}; non-2xx responses in all runs: {bad}; {load}",
            )
        )
        sec.rows.append(
            row(
                f"decision endpoint, {conns} connections: p99 latency",
                nl["p99_ms"],
                ngx["p99_ms"],
                unit="ms",
                better="lower",
                peer_name="nginx limit_req (1 worker)",
                goal=f"<= {GOAL_P99_MS:g} ms",
                met=nl["p99_ms"] <= GOAL_P99_MS,
                note=f"p50 {nl['p50_ms']:.3f} vs {ngx['p50_ms']:.3f} ms; p99 per round "
                f"{', '.join(format(x['p99_ms'], '.2f') for x in runs['netlimit'])} vs "
                f"{', '.join(format(x['p99_ms'], '.2f') for x in runs['nginx'])} ms",
            )
        )
        added = [a["p99_ms"] - b["p99_ms"] for a, b in zip(runs["proxy"], runs["direct"])]
        added_p99 = median(added)
        added_p50 = median([a["p50_ms"] - b["p50_ms"] for a, b in zip(runs["proxy"], runs["direct"])])
        sec.rows.append(
            row(
                "proxy mode, 1 connection: p99 latency (added = through sidecar - direct)",
                med["proxy"]["p99_ms"],
                med["direct"]["p99_ms"],
                unit="ms",
                better="lower",
                peer_name="the same nginx upstream, direct",
                ratio=None,
                goal=f"added <= {GOAL_ADDED_P99_MS:g} ms",
                met=added_p99 <= GOAL_ADDED_P99_MS,
                note=f"added p99 {added_p99:.3f} ms (per round "
                f"{', '.join(format(x, '.2f') for x in added)}), added p50 {added_p50:.3f} ms; "
                f"{med['proxy']['rps']:,.0f} vs {med['direct']['rps']:,.0f} requests/s",
                added_p99_ms=added_p99,
                added_p50_ms=added_p50,
            )
        )
        sec.details["load_average"] = {"before": load_before, "after": load_after}
        # the same question with paired samples: direct and proxied requests alternate
        pd, pp = paired_latency(p_static, p_proxy, mode.pick(2000, 20000))
        d50, d99, x50, x99 = _pct(pd, 50), _pct(pd, 99), _pct(pp, 50), _pct(pp, 99)
        sec.rows.append(
            row(
                "proxy mode, paired samples (one client alternating direct and proxied requests): p99 latency",
                x99,
                d99,
                unit="ms",
                better="lower",
                peer_name="the same nginx upstream, direct",
                ratio=None,
                goal="diagnostic",
                met=None,
                note=f"added p99 {x99 - d99:.3f} ms, added p50 {x50 - d50:.3f} ms "
                f"({len(pd):,} pairs; client in Python, its time is in both)",
                added_p99_ms=x99 - d99,
                added_p50_ms=x50 - d50,
            )
        )
        sec.details["runs"] = runs
        sec.details["connections"] = conns
        sec.details["what"] = __doc__.split("\n\n", 1)[1].strip()
    finally:
        for p in reversed(procs):
            stop(p)
        shutil.rmtree(d, ignore_errors=True)
    return sec
