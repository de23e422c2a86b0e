#!/usr/bin/env python3
"""Soak the sidecar's front door: legitimate clients and hostile ones at once.

    .venv/bin/python scripts/soak_sidecar.py --seconds 300      # the 5-minute soak
    .venv/bin/python scripts/soak_sidecar.py --seconds 15 --json   # what the test suite runs

A sidecar in proxy mode (a real process) in front of a small upstream in this
process, on loopback only.  For the whole run:

* legitimate clients: keep-alive GETs, each timed (latency p50/p99), no 5xx allowed;
* slowloris: connections that trickle a request head a byte at a time;
* garbage: malformed requests (control bytes, bad lengths, CONNECT, smuggling shapes);
* hoarders: pipelined requests from clients that never read their answers;
* quitters: uploads abandoned half-way.

Every second the sidecar's RSS and open descriptors are sampled.  Prints a summary
(or JSON) and exits 1 when a bound is broken: a 5xx, RSS growth over 64 MiB,
descriptors over the connection cap + 64, or legitimate clients failing.
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
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


class Stats:
    def __init__(self) -> None:
        self.lat: list[float] = []
        self.ok = self.failed = self.server_errors = 0
        self.hostile = 0
        self.rss: list[int] = []
        self.fds: list[int] = []


async def legit(port: int, until: float, st: Stats) -> None:
    while time.monotonic() < until:
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
        except (OSError, TimeoutError):
            st.failed += 1
            await asyncio.sleep(0.05)
            continue
        try:
            for _ in range(50):
                if time.monotonic() >= until:
                    break
                t0 = time.perf_counter()
                w.write(b"GET /app HTTP/1.1\r\nHost: soak\r\n\r\n")
                head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 10)
                n = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
                await r.readexactly(n)
                st.lat.append(time.perf_counter() - t0)
                code = int(head[9:12])
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


async def slowloris(port: int, until: float, st: Stats) -> None:
    while time.monotonic() < until:
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            for ch in b"GET /slow HTTP/1.1\r\nHost: a\r\nX-A: " + b"b" * 1000:
                if time.monotonic() >= until or r.at_eof() or w.is_closing():
                    break
                w.write(bytes([ch]))
                await asyncio.sleep(0.5)
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
    """Pipelines without ever reading (a blocking socket in a thread: it stops when the
    sidecar stops reading it)."""
    while time.monotonic() < until:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                for _ in range(200):
                    if time.monotonic() >= until:
                        break
                    s.sendall(b"GET /hoard HTTP/1.1\r\nHost: a\r\n\r\n" * 500)
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


async def run(seconds: float, max_connections: int) -> tuple[Stats, dict]:
    up = await asyncio.start_server(upstream, "127.0.0.1", 0)
    up_port = up.sockets[0].getsockname()[1]
    d = Path(tempfile.mkdtemp(prefix="netlimit-soak-"))
    (d / "n.yaml").write_text(CONFIG)
    exe = Path(sys.executable).with_name("netlimit")
    log = open(d / "sidecar.log", "w")
    proc = subprocess.Popen(
        [str(exe), "sidecar", "--config", str(d / "n.yaml"), "--listen", "127.0.0.1:0", "--upstream",
         f"http://127.0.0.1:{up_port}", "--admin-listen", "127.0.0.1:0", "--header-timeout", "3",
         "--max-connections", str(max_connections)],
        stdout=subprocess.DEVNULL, stderr=log,
    )  # fmt: skip
    st = Stats()
    try:
        port = 0
        deadline = time.monotonic() + 20
        while not port and time.monotonic() < deadline:
            text = (d / "sidecar.log").read_text()
            for line in text.splitlines():
                if "listening on http://127.0.0.1:" in line:
                    port = int(line.split("127.0.0.1:")[1].split(" ")[0])
            await asyncio.sleep(0.1)
        if not port:
            raise SystemExit(f"the sidecar did not start:\n{(d / 'sidecar.log').read_text()[-2000:]}")
        until = time.monotonic() + seconds
        loop = asyncio.get_running_loop()
        tasks = [asyncio.create_task(legit(port, until, st)) for _ in range(4)]
        tasks += [asyncio.create_task(slowloris(port, until, st)) for _ in range(30)]
        tasks += [asyncio.create_task(garbage(port, until, st)) for _ in range(2)]
        tasks += [asyncio.create_task(quitter(port, until, st)) for _ in range(2)]
        tasks.append(asyncio.create_task(sampler(proc.pid, until, st)))
        hoarders = [loop.run_in_executor(None, hoarder, port, until, st) for _ in range(2)]
        await asyncio.gather(*tasks, *hoarders)
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
    return st, {
        "tracebacks": text.count("Traceback"),
        "log_lines": len(text.splitlines()),
        "log_bytes": len(text),
        "log_kinds": dict(kinds.most_common(8)),
    }


def main() -> int:
    import logging

    logging.getLogger("asyncio").setLevel(logging.CRITICAL)  # our hostile clients' own write errors
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--max-connections", type=int, default=256)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    st, log = asyncio.run(run(a.seconds, a.max_connections))
    lat = sorted(st.lat) or [0.0]
    res = {
        "seconds": a.seconds,
        "legit_ok": st.ok,
        "legit_failed": st.failed,
        "server_errors": st.server_errors,
        "hostile_connections": st.hostile,
        "latency_ms": {
            "p50": round(statistics.median(lat) * 1000, 3),
            "p99": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, 3),
            "max": round(lat[-1] * 1000, 3),
        },
        "rss_kib": {"first": st.rss[0] if st.rss else None, "max": max(st.rss, default=None),
                    "last": st.rss[-1] if st.rss else None},
        "fds_max": max(st.fds, default=None),
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
    res["problems"] = problems
    print(json.dumps(res, indent=2) if a.json else "\n".join(f"{k}: {v}" for k, v in res.items()))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
