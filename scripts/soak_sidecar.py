#!/usr/bin/env python3
"""Soak the sidecar's front door: legitimate clients and hostile ones at once.

    .venv/bin/python scripts/soak_sidecar.py --seconds 300      # the 5-minute soak
    .venv/bin/python scripts/soak_sidecar.py --seconds 15 --json   # what the test suite runs

A sidecar in proxy mode (a real process) in front of a small upstream in this
process, on loopback only.  For the whole run:

* legitimate proxy clients: keep-alive GETs, each timed, no 5xx allowed (a
  keep-alive connection closed while idle -- shed at the connection cap -- is
  reconnected and the request sent again, as HTTP clients do);
* decision clients: keep-alive ``GET /v1/check`` on the admin listener, each timed;
* slowloris: more connections than ``--max-connections``, each trickling a
  request head a byte a second, so the proxy listener sits at its cap;
* garbage: malformed requests (control bytes, bad lengths, CONNECT, smuggling shapes);
* hoarders: pipelined requests from clients that never read their answers
  (cut by ``--send-timeout``);
* quitters: uploads abandoned half-way.

Every second the sidecar's RSS and open descriptors are sampled.  Prints a summary
(or JSON) and exits 1 when a bound is broken: a 5xx to a legitimate client,
legitimate clients failing (over 1 %), RSS growth over 64 MiB, descriptors over
the connection cap + 64, the decision endpoint's p99 over ``--max-decision-p99-ms``
(default 50 ms: client-observed, with this script's own hostile clients sharing
the 2 cores), a queue deeper than the pipeline bound, an internal error, or a
traceback in the log.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIG = """\
version: 1
http:
  domain: soak
  actions: [[remote_address]]
  descriptors:
    - key: remote_address
      rate_limit: {unit: second, requests_per_unit: 100000000, name: everyone}
"""

GARBAGE = [
    b"GET /x\t HTTP/1.1\r\nHost: a\r\n\r\n",
    b"GET /x HTTP/1.1\r\n\r\n",
    b"CONNECT 127.0.0.1:22 HTTP/1.1\r\nHost: a\r\n\r\n",
    b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: \xc2\xb2\r\n\r\n",
    b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"POST /x HTTP/1.1\r\nHost: a\r\nConnection: Content-Length\r\nContent-Length: 33\r\n\r\n"
    b"GET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n",
    b"GET /x HTTP/1.1\r\nHost: a\r\nX: " + b"a" * 70000 + b"\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
]


#: what the upstream answers a hoarder's request: with 2-byte answers the hoarder's
#: socket buffers took thousands of proxied requests to fill, which a loaded machine
#: did not get through before the run ended (no send timeout was seen)
HOARD_BODY = b"h" * 64 * 1024


async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            n = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    n = int(line.split(b":", 1)[1])
            if n:
                await reader.readexactly(n)
            body = HOARD_BODY if head.startswith(b"GET /hoard ") else b"ok"
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


class Stats:
    def __init__(self) -> None:
        self.lat: list[float] = []
        self.decision_lat: list[float] = []
        self.ok = self.failed = self.server_errors = self.retried = 0
        self.decisions = self.decision_failed = 0
        self.hostile = 0
        self.slow_cut = 0
        self.rss: list[int] = []
        self.fds: list[int] = []


async def _exchange(r: asyncio.StreamReader, w: asyncio.StreamWriter, raw: bytes) -> int:
    w.write(raw)
    head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 10)
    n = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
    await r.readexactly(n)
    return int(head[9:12])


async def legit(port: int, until: float, st: Stats) -> None:
    """Keep-alive GETs through the proxy; a reused connection closed before any answer
    (shed while idle at the cap) is opened again and the request resent once."""
    raw = b"GET /app HTTP/1.1\r\nHost: soak\r\n\r\n"
    while time.monotonic() < until:
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
        except (OSError, TimeoutError):
            st.failed += 1
            await asyncio.sleep(0.05)
            continue
        try:
            for i in range(50):
                if time.monotonic() >= until:
                    break
                t0 = time.perf_counter()
                try:
                    code = await _exchange(r, w, raw)
                except (asyncio.IncompleteReadError, ConnectionError) as exc:
                    partial = isinstance(exc, asyncio.IncompleteReadError) and exc.partial
                    if i == 0 or partial:
                        raise
                    st.retried += 1
                    w.close()
                    r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
                    code = await _exchange(r, w, raw)
                st.lat.append(time.perf_counter() - t0)
                if code >= 500:
                    st.server_errors += 1
                elif code == 200:
                    st.ok += 1
                else:
                    st.failed += 1
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError, IndexError):
            st.failed += 1
        finally:
            w.close()


async def decider(port: int, until: float, st: Stats) -> None:
    """nginx auth_request's side: keep-alive GET /v1/check on the admin listener."""
    raw = b"GET /v1/check HTTP/1.1\r\nHost: soak\r\nX-Original-URI: /app\r\nX-Original-Method: GET\r\n\r\n"
    while time.monotonic() < until:
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
        except (OSError, TimeoutError):
            st.decision_failed += 1
            await asyncio.sleep(0.05)
            continue
        try:
            for _ in range(200):
                if time.monotonic() >= until:
                    break
                t0 = time.perf_counter()
                code = await _exchange(r, w, raw)
                st.decision_lat.append(time.perf_counter() - t0)
                if code == 200:
                    st.decisions += 1
                else:
                    st.decision_failed += 1
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError, IndexError):
            st.decision_failed += 1
        finally:
            w.close()


async def slowloris(port: int, until: float, st: Stats) -> None:
    """A request head a byte a second, for ever; opened again when cut."""
    while time.monotonic() < until:
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            for ch in b"GET /slow HTTP/1.1\r\nHost: a\r\nX-A: " + b"b" * 1000:
                if time.monotonic() >= until or r.at_eof() or w.is_closing():
                    break
                w.write(bytes([ch]))
                await asyncio.sleep(1.0)
            if time.monotonic() < until:
                st.slow_cut += 1
            w.close()
            st.hostile += 1
        except OSError:
            await asyncio.sleep(0.1)


async def garbage(port: int, until: float, st: Stats) -> None:
    rnd = random.Random(7)
    while time.monotonic() < until:
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(rnd.choice(GARBAGE))
            await asyncio.wait_for(r.read(65536), 3)
            w.close()
            st.hostile += 1
        except (OSError, TimeoutError):
            pass
        await asyncio.sleep(0.002)


def hoarder(port: int, until: float, st: Stats) -> None:
    """Pipelines without ever reading, on one connection for as long as the sidecar
    keeps it (a blocking socket in a thread: it blocks when the sidecar stops
    reading it, until the sidecar aborts it at its send timeout)."""
    batch = b"GET /hoard HTTP/1.1\r\nHost: a\r\n\r\n" * 500
    while time.monotonic() < until:
        try:
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # its answers back up sooner
                s.settimeout(max(0.1, min(30.0, until - time.monotonic())))
                s.connect(("127.0.0.1", port))
                while time.monotonic() < until:
                    s.sendall(batch)
        except OSError:
            pass
        st.hostile += 1


async def quitter(port: int, until: float, st: Stats) -> None:
    while time.monotonic() < until:
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: 1000000\r\n\r\n" + b"x" * 3000)
            await asyncio.sleep(0.2)
            w.transport.abort()
            st.hostile += 1
        except OSError:
            await asyncio.sleep(0.1)


async def sampler(pid: int, until: float, st: Stats) -> None:
    while time.monotonic() < until:
        try:
            with open(f"/proc/{pid}/status") as f:
                st.rss.append(int(next(x.split()[1] for x in f if x.startswith("VmRSS:"))))
            st.fds.append(len(os.listdir(f"/proc/{pid}/fd")))
        except (OSError, StopIteration):
            pass
        await asyncio.sleep(1)


async def run(seconds: float, max_connections: int) -> tuple[Stats, dict, dict]:
    up = await asyncio.start_server(upstream, "127.0.0.1", 0)
    up_port = up.sockets[0].getsockname()[1]
    d = Path(tempfile.mkdtemp(prefix="netlimit-soak-"))
    (d / "n.yaml").write_text(CONFIG)
    exe = Path(sys.executable).with_name("netlimit")
    log = open(d / "sidecar.log", "w")
    proc = subprocess.Popen(
        [str(exe), "sidecar", "--config", str(d / "n.yaml"), "--listen", "127.0.0.1:0", "--upstream",
         f"http://127.0.0.1:{up_port}", "--admin-listen", "127.0.0.1:0", "--header-timeout", "30",
         "--send-timeout", "5", "--max-connections", str(max_connections)],
        stdout=subprocess.DEVNULL, stderr=log,
    )  # fmt: skip
    st = Stats()
    counters: dict = {}
    try:
        port = admin = 0
        deadline = time.monotonic() + 20
        while not (port and admin) and time.monotonic() < deadline:
            text = (d / "sidecar.log").read_text()
            for line in text.splitlines():
                if "listening on http://127.0.0.1:" in line:
                    port = int(line.split("127.0.0.1:")[1].split(" ")[0])
                if "admin listener on http://127.0.0.1:" in line:
                    admin = int(line.split("127.0.0.1:")[1].split(" ")[0])
            await asyncio.sleep(0.1)
        if not (port and admin):
            raise SystemExit(f"the sidecar did not start:\n{(d / 'sidecar.log').read_text()[-2000:]}")
        until = time.monotonic() + seconds
        loop = asyncio.get_running_loop()
        tasks = [asyncio.create_task(legit(port, until, st)) for _ in range(4)]
        tasks += [asyncio.create_task(decider(admin, until, st)) for _ in range(2)]
        tasks += [asyncio.create_task(slowloris(port, until, st)) for _ in range(max_connections + 64)]
        tasks += [asyncio.create_task(garbage(port, until, st)) for _ in range(2)]
        tasks += [asyncio.create_task(quitter(port, until, st)) for _ in range(2)]
        tasks.append(asyncio.create_task(sampler(proc.pid, until, st)))
        hoarders = [loop.run_in_executor(None, hoarder, port, until, st) for _ in range(2)]
        await asyncio.gather(*tasks, *hoarders)
        counters = await loop.run_in_executor(None, scrape, admin)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        up.close()
        log.close()
    text = (d / "sidecar.log").read_text()
    # which messages the log holds, by shape (digits and addresses folded), most frequent first
    kinds = collections.Counter(re.sub(r"[0-9]+", "N", line.split(": ", 1)[-1])[:100] for line in text.splitlines())
    return (
        st,
        {
            "tracebacks": text.count("Traceback"),
            "log_lines": len(text.splitlines()),
            "log_bytes": len(text),
            "log_kinds": dict(kinds.most_common(8)),
        },
        counters,
    )


def scrape(port: int) -> dict:
    """What the sidecar's own metrics say about the run."""
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict = {"timeouts": {}}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        if 'listener="main"' not in name:
            continue
        if name.startswith("netlimit_http_connection_timeouts_total"):
            out["timeouts"][name.split('kind="')[1].split('"')[0]] = int(float(value))
        for key in (
            "connections_shed_total",
            "connections_refused_total",
            "pipeline_queued_max",
            "internal_errors_total",
        ):
            if name.startswith("netlimit_http_" + key + "{"):
                out[key] = int(float(value))
    return out


def main() -> int:
    import logging

    logging.getLogger("asyncio").setLevel(logging.CRITICAL)  # our hostile clients' own write errors
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--max-connections", type=int, default=256)
    ap.add_argument("--max-decision-p99-ms", type=float, default=50.0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    st, log, counters = asyncio.run(run(a.seconds, a.max_connections))
    res = {
        "seconds": a.seconds,
        "legit_ok": st.ok,
        "legit_failed": st.failed,
        "legit_retried": st.retried,
        "server_errors": st.server_errors,
        "decisions": st.decisions,
        "decisions_failed": st.decision_failed,
        "hostile_connections": st.hostile,
        "slowloris_cut": st.slow_cut,
        "latency_ms": _quantiles(st.lat),
        "decision_latency_ms": _quantiles(st.decision_lat),
        "rss_kib": {"first": st.rss[0] if st.rss else None, "max": max(st.rss, default=None),
                    "last": st.rss[-1] if st.rss else None, "every_30s": st.rss[::30]},
        "fds_first": st.fds[0] if st.fds else None,
        "fds_max": max(st.fds, default=None),
        "fds_last": st.fds[-1] if st.fds else None,
        "sidecar": counters,
        **log,
    }  # fmt: skip
    growth = (res["rss_kib"]["max"] or 0) - (res["rss_kib"]["first"] or 0)
    problems = []
    if st.server_errors:
        problems.append(f"{st.server_errors} legitimate requests got a 5xx")
    if growth > 64 * 1024:
        problems.append(f"RSS grew by {growth} KiB")
    if (res["fds_max"] or 0) > a.max_connections + 64:
        problems.append(f"{res['fds_max']} open descriptors")
    if st.ok == 0 or st.failed > st.ok * 0.01:
        problems.append(f"legitimate clients: {st.ok} ok, {st.failed} failed")
    if log["tracebacks"]:
        problems.append(f"{log['tracebacks']} tracebacks in the sidecar's log")
    if st.decisions == 0 or st.decision_failed > st.decisions * 0.01:
        problems.append(f"decision clients: {st.decisions} ok, {st.decision_failed} failed")
    if res["decision_latency_ms"]["p99"] > a.max_decision_p99_ms:
        problems.append(f"decision p99 {res['decision_latency_ms']['p99']} ms > {a.max_decision_p99_ms} ms")
    if counters.get("pipeline_queued_max", 0) > 32:
        problems.append(f"a connection queued {counters['pipeline_queued_max']} requests (bound: 32)")
    if counters.get("internal_errors_total", 0):
        problems.append(f"{counters['internal_errors_total']} internal errors")
    res["problems"] = problems
    print(json.dumps(res, indent=2) if a.json else "\n".join(f"{k}: {v}" for k, v in res.items()))
    return 1 if problems else 0


def _quantiles(values: list[float]) -> dict:
    lat = sorted(values) or [0.0]
    return {
        "n": len(values),
        "p50": round(statistics.median(lat) * 1000, 3),
        "p99": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, 3),
        "max": round(lat[-1] * 1000, 3),
    }


if __name__ == "__main__":
    sys.exit(main())
