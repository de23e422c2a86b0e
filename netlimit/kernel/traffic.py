"""Bounded test traffic between network namespaces (for `netlimit demo` and the netns tests).

Every generator runs as a child process inside a namespace (`ip netns exec`),
is bounded in packets and seconds, and only ever addresses the peer namespace.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field

from ..errors import NetlimitError
from .netns import exec_prefix

PY = sys.executable


class ToolMissing(NetlimitError):
    pass


def need(tool: str) -> str:
    path = shutil.which(tool)
    if not path:
        pkg = "iptables" if "iptables" in tool else "nftables" if tool == "nft" else tool
        raise ToolMissing(f"{tool} is not installed (apt-get install {pkg})")
    return path


_UDP_FLOOD = r"""
import socket, sys, time, json
src, dst, port, pps, secs, fam = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
timed = len(sys.argv) > 7 and sys.argv[7] == "times"
s = socket.socket(socket.AF_INET if fam == 4 else socket.AF_INET6, socket.SOCK_DGRAM)
s.bind((src, 0))
payload = b"x" * 32
n_total = int(pps * secs)
t0 = time.monotonic()
sent = 0
last = t0
times = []
while sent < n_total:
    due = t0 + sent / pps
    now = time.monotonic()
    if now < due:
        time.sleep(min(due - now, 0.002))
        continue
    try:
        s.sendto(payload, (dst, port))
    except OSError:
        pass
    last = time.monotonic()
    if timed:
        times.append(round(last - t0, 6))
    sent += 1
print(json.dumps({"sent": sent, "duration": last - t0, "start": t0, "end": last, "times": times}))
"""


@dataclass
class FloodResult:
    sent: int
    duration: float
    start: float = 0.0  # CLOCK_MONOTONIC (one clock for every namespace) of the first and last send
    end: float = 0.0
    times: list[float] = field(default_factory=list)  # each send, s after the start (udp_flood_start times=True)

    @property
    def pps(self) -> float:
        return self.sent / self.duration if self.duration > 0 else 0.0


def udp_flood_start(
    ns: str, src: str, dst: str, port: int, pps: float, seconds: float, times: bool = False
) -> subprocess.Popen:
    """A UDP flood from `src` in `ns`; `times`: its result lists each send's time."""
    fam = 6 if ":" in dst else 4
    return subprocess.Popen(
        exec_prefix(ns)
        + [PY, "-c", _UDP_FLOOD, src, dst, str(port), str(pps), str(seconds), str(fam)]
        + (["times"] if times else []),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def flood_result(p: subprocess.Popen, timeout: float = 60) -> FloodResult:
    out, errout = p.communicate(timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"udp flood failed: {errout.strip()}")
    d = json.loads(out)
    return FloodResult(d["sent"], d["duration"], d.get("start", 0.0), d.get("end", 0.0), d.get("times") or [])


def bucket_passes(times: list[float], rate: float, burst: int) -> int:
    """How many packets sent at `times` (s) a token bucket of `rate` per second and
    `burst` deep, full at the start, lets pass: rate x span + burst when the sender kept
    up, fewer when it paused (a busy host): the bucket banks at most `burst` for a pause,
    and the sender's catch-up comes as a clump. (vagrant/scenario.py has the same replay
    over the limiter NIC's arrival times; it runs where netlimit is not importable.)"""
    tokens, prev, passed = float(burst), None, 0
    for t in times:
        if prev is not None:
            tokens = min(float(burst), tokens + rate * (t - prev))
        prev = t
        if tokens >= 1.0:
            tokens -= 1.0
            passed += 1
    return passed


def udp_flood(ns: str, src: str, dst: str, port: int, pps: float, seconds: float) -> FloodResult:
    return flood_result(udp_flood_start(ns, src, dst, port, pps, seconds), timeout=seconds + 30)


_TCP_CONNECT = r"""
import socket, sys, time, json
src, dst, port, n, timeout, hold, gap = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6]), float(sys.argv[7])
fam = socket.AF_INET6 if ":" in dst else socket.AF_INET
res, keep = [], []
for i in range(n):
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.bind((src, 0))
    s.settimeout(timeout)
    try:
        s.connect((dst, port))
        res.append(True)
        keep.append(s)
    except OSError:
        res.append(False)
        s.close()
    if gap:
        time.sleep(gap)
print(json.dumps(res), flush=True)
time.sleep(hold)
for s in keep:
    s.close()
"""


def tcp_connects(
    ns: str, src: str, dst: str, port: int, n: int, *, timeout: float = 1.0, hold: float = 0.0, gap: float = 0.0
) -> list[bool]:
    """Open n connections one after the other (all kept open until the end); which succeeded."""
    p = subprocess.run(
        exec_prefix(ns) + [PY, "-c", _TCP_CONNECT, src, dst, str(port), str(n), str(timeout), str(hold), str(gap)],
        capture_output=True,
        text=True,
        timeout=n * (timeout + gap) + hold + 30,
    )
    if p.returncode != 0:
        raise RuntimeError(f"tcp connects failed: {p.stderr.strip()}")
    return json.loads(p.stdout.strip().splitlines()[0])


_TCP_LISTEN = r"""
import socket, sys, threading, time
addr, port, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
ls = socket.socket(fam, socket.SOCK_STREAM)
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind((addr, port))
ls.listen(128)
ls.settimeout(0.2)
print("ready", flush=True)
held = []
end = time.monotonic() + secs
while time.monotonic() < end:
    try:
        c, _ = ls.accept()
        held.append(c)
    except OSError:
        pass
"""


def tcp_listener(ns: str, addr: str, port: int, seconds: float = 60) -> subprocess.Popen:
    """A listener that accepts and holds connections for `seconds` (then exits)."""
    p = subprocess.Popen(
        exec_prefix(ns) + [PY, "-c", _TCP_LISTEN, addr, str(port), str(seconds)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = p.stdout.readline() if p.stdout else ""
    if "ready" not in line:
        p.kill()
        raise RuntimeError(f"listener did not start: {p.stderr.read() if p.stderr else ''}")
    return p


@dataclass
class IperfResult:
    bits_per_second: float
    retransmits: int
    seconds: float


def iperf3(
    server_ns: str,
    client_ns: str,
    server_ip: str,
    *,
    port: int = 5201,
    seconds: float = 5,
    reverse: bool = False,
    omit: int = 1,
    bind: str | None = None,
) -> IperfResult:
    """TCP goodput between namespaces (receiver side), bounded in time."""
    exe = need("iperf3")
    srv = subprocess.Popen(
        exec_prefix(server_ns) + [exe, "-s", "-1", "-p", str(port), "-B", server_ip],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        cmd = [exe, "-c", server_ip, "-p", str(port), "-t", str(seconds), "-O", str(omit), "-J"]
        if reverse:
            cmd.append("-R")
        if bind:
            cmd += ["-B", bind]
        out = None
        for _ in range(50):  # wait for the server to listen
            p = subprocess.run(
                exec_prefix(client_ns) + cmd, capture_output=True, text=True, timeout=seconds + omit + 30
            )
            data = json.loads(p.stdout or "{}")
            if p.returncode == 0 and "error" not in data:
                out = data
                break
            if "Connection refused" not in (data.get("error", "") + p.stderr):
                raise RuntimeError(f"iperf3 failed: {data.get('error') or p.stderr.strip()}")
            time.sleep(0.1)
        if out is None:
            raise RuntimeError("iperf3 server did not start")
        end = out["end"]
        recv = end["sum_received"]
        sent = end.get("sum_sent", {})
        return IperfResult(recv["bits_per_second"], int(sent.get("retransmits", 0) or 0), recv["seconds"])
    finally:
        try:
            srv.wait(timeout=5)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()


def nft_counter(ns: str, table: str, comment: str) -> int:
    """Packets counted by the rule carrying `comment` in nft table `table` ("ip nldemo")."""
    out = subprocess.run(
        exec_prefix(ns) + [need("nft"), "-j", "list", "table", *table.split()],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    for item in json.loads(out).get("nftables", []):
        rule = item.get("rule")
        if rule and rule.get("comment") == comment:
            return sum(e["counter"]["packets"] for e in rule["expr"] if "counter" in e)
    raise RuntimeError(f"no rule with comment {comment!r} in nft table {table} of namespace {ns}")


def save_counters(ns: str, family: int = 4) -> str:
    tool = need("iptables-legacy-save" if family == 4 else "ip6tables-legacy-save")
    return subprocess.run(exec_prefix(ns) + [tool, "-c"], capture_output=True, text=True, check=True, timeout=30).stdout


def counter_by_comment(ns: str, comment: str, family: int = 4) -> int:
    """Packets counted by the rule carrying `comment` (iptables-legacy-save -c)."""
    total = 0
    found = False
    for line in save_counters(ns, family).splitlines():
        if f'--comment "{comment}"' in line or f"--comment {comment} " in line:
            found = True
            total += int(line.split("]")[0].lstrip("[").split(":")[0])
    if not found:
        raise RuntimeError(f"no rule with comment {comment!r} in namespace {ns}")
    return total
