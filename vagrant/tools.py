"""Bounded traffic and measurement tools for the netlimit scenario (stdlib only).

The scenario copies this file to every host (a VM or a network namespace) and
runs it there as root with the host's own python3:

    python3 tools.py udp-flood   --src A --dst B --port P --pps N --seconds T
    python3 tools.py syn-flood   --src A --dst B --port P --pps N --seconds T
    python3 tools.py connects    --src A --dst B --port P --rate R --seconds T
    python3 tools.py watch       --iface IF --seconds T [--udp-port P] [--tcp-port P] [--listen-tcp ADDR:P]
    python3 tools.py bulk-serve  --bind A --port P --seconds T --streams N
    python3 tools.py bulk-recv   --src A --dst B --port P --seconds T --omit S --streams N
    python3 tools.py http        --src A --url URL --n N [--gap S]
    python3 tools.py counters    (iptables-legacy -S INPUT with packet counts, as JSON)

Every command is bounded in packets and seconds, prints one JSON object on
stdout at the end (`watch` first prints READY), and only addresses the
destination it is given.
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import struct
import subprocess
import sys
import threading
import time

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux; the socket module lacks the name
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)  # root may go past net.core.rmem_max
HARD_LIMIT_S = 120.0  # no command ever runs longer than this
MAX_TIMES = 100_000  # arrival times the watcher keeps per flow (the floods send a few thousand)
MAX_PPS = 5000.0


def _out(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _paced(pps: float, seconds: float, send) -> dict:
    """Call send() pps times a second for `seconds`; never more than pps x seconds calls."""
    if pps > MAX_PPS:
        pps = MAX_PPS
    if seconds > HARD_LIMIT_S:
        seconds = HARD_LIMIT_S
    n_total = int(pps * seconds)
    t0 = time.monotonic()
    sent = errors = 0
    last = t0
    while sent < n_total:
        due = t0 + sent / pps
        now = time.monotonic()
        if now < due:
            time.sleep(min(due - now, 0.002))
            continue
        if now - t0 > seconds + 5:  # a stalled host: stop rather than overrun
            break
        try:
            send(sent)
        except OSError:
            errors += 1
        last = time.monotonic()
        sent += 1
    return {"sent": sent, "errors": errors, "duration": last - t0}


# --- senders -------------------------------------------------------------------------


def udp_flood(a) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((a.src, 0))
    payload = b"x" * 32
    _out(_paced(a.pps, a.seconds, lambda i: s.sendto(payload, (a.dst, a.port))))


def _csum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def _syn(src: str, dst: str, sport: int, dport: int, seq: int) -> bytes:
    hdr = struct.pack("!HHIIBBHHH", sport, dport, seq, 0, 5 << 4, 0x02, 64240, 0, 0)
    pseudo = socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack("!BBH", 0, socket.IPPROTO_TCP, len(hdr))
    c = _csum(pseudo + hdr)
    return hdr[:16] + struct.pack("!H", c) + hdr[18:]


def syn_flood(a) -> None:
    """Bare SYNs from ever-new source ports (each a NEW conntrack entry); nothing is ever completed."""
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)
    s.bind((a.src, 0))
    base = 20000

    def send(i: int) -> None:
        sport = base + i % 40000
        s.sendto(_syn(a.src, a.dst, sport, a.port, 0x4E4C0000 + i), (a.dst, 0))

    _out(_paced(a.pps, a.seconds, send))


def connects(a) -> None:
    """A well-behaved client: real TCP connections at a modest rate, each closed at once."""
    n_total = int(min(a.rate * a.seconds, 10_000))
    t0 = time.monotonic()
    results, times = [], []
    for i in range(n_total):
        due = t0 + i / a.rate
        now = time.monotonic()
        if now < due:
            time.sleep(due - now)
        if time.monotonic() - t0 > a.seconds + 10:
            break
        c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        c.bind((a.src, 0))
        c.settimeout(a.timeout)
        t = time.monotonic()
        try:
            c.connect((a.dst, a.port))
            results.append(True)
        except OSError:
            results.append(False)
        times.append(time.monotonic() - t)
        c.close()
    _out(
        {
            "attempts": len(results),
            "ok": sum(results),
            "max_connect_s": max(times, default=0.0),
            "duration": time.monotonic() - t0,
        }
    )


# --- the receiving side ----------------------------------------------------------------


def watch(a) -> None:
    """Timestamp every packet of interest as it arrives on the interface (before netfilter).

    An AF_PACKET socket sees what the wire delivers to the host, with the
    kernel's arrival time (SO_TIMESTAMPNS), so the measured span is the one
    the limiter's hashlimit saw. Per (source, proto, dport): count, first, last.
    Stops `idle` seconds after the last packet, or at --seconds.
    """
    ETH_P_IP = 0x0800
    s = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(ETH_P_IP))  # cooked: the IP packet
    try:  # a stalled VM hands over ~1,000 queued packets at once: room for them beyond rmem_max
        s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 64 << 20)
    except OSError:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    s.bind((a.iface, ETH_P_IP))
    ports = {(17, p) for p in a.udp_port} | {(6, p) for p in a.tcp_port}
    stop = threading.Event()
    if a.listen_tcp:
        host, _, port = a.listen_tcp.rpartition(":")
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((host, int(port)))
        ls.listen(1024)
        ls.settimeout(0.2)

        def accept() -> None:
            while not stop.is_set():
                try:
                    c, _ = ls.accept()
                    c.close()
                except OSError:
                    pass

        threading.Thread(target=accept, daemon=True).start()
    print("READY", flush=True)
    flows: dict[str, dict] = {}
    t_end = time.monotonic() + min(a.seconds, HARD_LIMIT_S)
    last_seen = None
    while True:
        now = time.monotonic()
        if now >= t_end or (last_seen is not None and now - last_seen > a.idle):
            break
        r, _, _ = select.select([s], [], [], 0.2)
        if not r:
            continue
        data, anc, _flags, _addr = s.recvmsg(256, 64)
        if len(data) < 24 or data[0] >> 4 != 4:
            continue
        ihl = (data[0] & 0x0F) * 4
        proto = data[9]
        if len(data) < ihl + 4:
            continue
        dport = struct.unpack("!H", data[ihl + 2 : ihl + 4])[0]
        if (proto, dport) not in ports:
            continue
        if proto == 6 and len(data) >= ihl + 14 and not (data[ihl + 13] & 0x02 and not data[ihl + 13] & 0x10):
            continue  # TCP: count SYNs only (not ACKs of the client's handshakes)
        ts = None
        for level, typ, cdata in anc:
            if level == socket.SOL_SOCKET and typ == SO_TIMESTAMPNS:
                sec, nsec = struct.unpack("qq", cdata[:16])
                ts = sec + nsec / 1e9
        if ts is None:
            ts = time.time()
        src = socket.inet_ntoa(data[12:16])
        key = f"{src} {'udp' if proto == 17 else 'tcp'}/{dport}"
        f = flows.setdefault(key, {"count": 0, "times": []})
        f["count"] += 1
        if len(f["times"]) < MAX_TIMES:
            f["times"].append(ts)
        last_seen = time.monotonic()
    stop.set()
    # PACKET_STATISTICS (SOL_PACKET=263, 6): packets seen / dropped by this socket
    try:
        st = s.getsockopt(263, 6, 8)
        seen, drops = struct.unpack("II", st)
    except OSError:
        seen, drops = -1, -1
    for f in flows.values():
        # arrival times from the flow's first packet, in µs steps (what a token-bucket replay needs)
        times = sorted(f["times"])
        f["span"] = times[-1] - times[0]
        f["times"] = [round(t - times[0], 6) for t in times]
    _out({"flows": flows, "socket_drops": drops, "socket_packets": seen})


class StallWatch:
    """Notices when this host stops running: a thread whose 20 ms sleeps should take 20 ms.

    An emulated VM on a busy host is sometimes not scheduled for seconds; its
    clock then jumps on. A goodput measured across such a pause measures the
    host, not the shaper, and the scenario measures again.
    """

    TICK, THRESHOLD = 0.02, 0.25

    def __init__(self) -> None:
        self.longest = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        prev = time.monotonic()
        while True:
            stopped = self._stop.wait(self.TICK)
            now = time.monotonic()
            late = now - prev - self.TICK  # also for the last tick: a stop may end a pause
            prev = now
            if late > self.THRESHOLD:
                self.longest = max(self.longest, late)
            if stopped:
                break

    def result(self) -> dict:
        self._stop.set()
        self._thread.join(timeout=1)
        return {"longest_stall_s": round(self.longest, 3)}


def bulk_serve(a) -> None:
    """Accept --streams connections and send on each as fast as TCP allows for --seconds.

    Several streams keep the shaped queue busy while any one sender waits for
    the CPU (a busy host or an emulated vCPU): the goodput then measures the
    shaper, not the sender's scheduling.
    """
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((a.bind, a.port))
    ls.listen(16)
    ls.settimeout(min(a.seconds + 30, HARD_LIMIT_S))
    print("READY", flush=True)
    conns = [ls.accept() for _ in range(max(1, min(a.streams, 16)))]
    stalls = StallWatch()
    t0 = time.monotonic()
    sent = [0] * len(conns)
    chunk = b"\x4e" * 65536

    def pump(i: int, c: socket.socket) -> None:
        c.settimeout(5)
        try:
            while time.monotonic() - t0 < min(a.seconds, HARD_LIMIT_S):
                sent[i] += c.send(chunk)
        except OSError:
            pass
        c.close()

    threads = [threading.Thread(target=pump, args=(i, c)) for i, (c, _) in enumerate(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _out({"sent_bytes": sum(sent), "streams": len(conns), "duration": time.monotonic() - t0, **stalls.result()})


def bulk_recv(a) -> None:
    """Receive --streams connections from bulk-serve; goodput of them all from --omit to --seconds."""
    socks = []
    deadline = time.monotonic() + 20
    while len(socks) < max(1, min(a.streams, 16)):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind((a.src, 0))
        s.settimeout(5)
        try:
            s.connect((a.dst, a.port))
            s.setblocking(False)
            socks.append(s)
        except OSError:
            s.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    stalls = StallWatch()
    t0 = time.monotonic()
    total = 0
    marks = [(0.0, 0)]  # (time, cumulative bytes of all streams)
    open_socks = set(socks)
    while open_socks and time.monotonic() - t0 < a.seconds + 15:
        r, _, _ = select.select(list(open_socks), [], [], 1.0)
        for s in r:
            try:
                data = s.recv(16384)  # small reads: fine-grained marks
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b""
            if not data:
                open_socks.discard(s)
                s.close()
                continue
            total += len(data)
            marks.append((time.monotonic() - t0, total))
    for s in open_socks:
        s.close()

    # the window where every sender is still writing (after start-up, before they
    # stop); the rate is the least-squares slope of bytes over time in it, so
    # neither edge's read granularity decides the result
    win = [(t, b) for t, b in marks if a.omit <= t <= a.seconds - 0.25]
    bps = 0.0
    if len(win) >= 3:
        n = len(win)
        mt = sum(t for t, _ in win) / n
        mb = sum(b for _, b in win) / n
        var = sum((t - mt) ** 2 for t, _ in win)
        bps = 8 * sum((t - mt) * (b - mb) for t, b in win) / var if var > 0 else 0.0
    lo, hi = (win[0], win[-1]) if win else ((0.0, 0), (0.0, 0))
    _out(
        {
            "bytes": total,
            "streams": len(socks),
            "duration": marks[-1][0],
            "measured_seconds": hi[0] - lo[0],
            "bits_per_second": bps,
            **stalls.result(),
        }
    )


def http(a) -> None:
    """N GET requests, one connection each, from --src; status codes and the headers that matter."""
    import http.client
    from urllib.parse import urlsplit

    u = urlsplit(a.url)
    statuses, first = [], {}
    keep = (
        "Retry-After",
        "X-RateLimit-Limit",
        "X-RateLimit-Remaining",
        "X-RateLimit-Retry-After",
        "RateLimit",
        "RateLimit-Policy",
    )
    t0 = time.monotonic()
    for i in range(min(a.n, 1000)):
        if time.monotonic() - t0 > HARD_LIMIT_S:
            break
        conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=10, source_address=(a.src, 0))
        try:
            conn.request("GET", u.path or "/")
            r = conn.getresponse()
            body = r.read()
            statuses.append(r.status)
            if r.status not in first:
                first[r.status] = {
                    "headers": {k: r.getheader(k) for k in keep if r.getheader(k) is not None},
                    "body": body[:300].decode("utf-8", "replace"),
                }
        except OSError as exc:
            statuses.append(f"error: {exc}")
        finally:
            conn.close()
        if a.gap:
            time.sleep(a.gap)
    _out({"statuses": statuses, "first": {str(k): v for k, v in first.items()}, "duration": time.monotonic() - t0})


def counters(a) -> None:
    """Packet counts of the filter and raw tables' rules, keyed by comment (iptables-legacy-save -c)."""
    out = "".join(
        subprocess.run(
            ["iptables-legacy-save", "-c", "-t", table], capture_output=True, text=True, check=True, timeout=30
        ).stdout
        for table in ("filter", "raw")
    )
    res: dict[str, int] = {}
    for line in out.splitlines():
        if not line.startswith("[") or "--comment" not in line:
            continue
        pkts = int(line[1 : line.index(":")])
        rest = line[line.index("]") + 1 :]
        com = rest.split("--comment", 1)[1].strip()
        com = com[1 : com.index('"', 1)] if com.startswith('"') else com.split()[0]
        res[com] = res.get(com, 0) + pkts
    _out(res)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tools.py")
    sub = p.add_subparsers(dest="cmd", required=True)

    def add(name, fn, *opts):
        sp = sub.add_parser(name)
        for o in opts:
            kind = {
                "--port": int,
                "--pps": float,
                "--seconds": float,
                "--rate": float,
                "--omit": float,
                "--n": int,
                "--gap": float,
                "--timeout": float,
                "--idle": float,
                "--streams": int,
            }.get(o, str)
            sp.add_argument(o, type=kind, required=o not in ("--gap", "--timeout", "--idle"))
        sp.set_defaults(fn=fn)
        return sp

    add("udp-flood", udp_flood, "--src", "--dst", "--port", "--pps", "--seconds")
    add("syn-flood", syn_flood, "--src", "--dst", "--port", "--pps", "--seconds")
    add("connects", connects, "--src", "--dst", "--port", "--rate", "--seconds", "--timeout")
    w = add("watch", watch, "--iface", "--seconds", "--idle")
    w.add_argument("--udp-port", type=int, action="append", default=[])
    w.add_argument("--tcp-port", type=int, action="append", default=[])
    w.add_argument("--listen-tcp", default=None)
    add("bulk-serve", bulk_serve, "--bind", "--port", "--seconds", "--streams")
    add("bulk-recv", bulk_recv, "--src", "--dst", "--port", "--seconds", "--omit", "--streams")
    add("http", http, "--src", "--url", "--n", "--gap")
    add("counters", counters)
    a = p.parse_args(argv)
    if getattr(a, "timeout", None) is None and a.cmd == "connects":
        a.timeout = 3.0
    if getattr(a, "idle", None) is None and a.cmd == "watch":
        a.idle = 2.0
    if getattr(a, "gap", None) is None and a.cmd == "http":
        a.gap = 0.0
    a.fn(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
