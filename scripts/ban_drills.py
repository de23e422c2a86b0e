#!/usr/bin/env python3
"""Escalation and bans, measured with real traffic (README: Escalation and bans).

    .venv/bin/python scripts/ban_drills.py                       # everything, the README's figures
    .venv/bin/python scripts/ban_drills.py --only latency --trials 20
    ... --bans 100000 --backend nftables|restore|both --json FILE

The fleet: one LAN (a bridge in a namespace of its own) joining host A, host B and a
client, each a namespace; one real Redis on a unix socket (reachable from every
namespace); a real netlimitd per host (started from the root namespace with --netns)
and a real sidecar inside host A (`ip netns exec`), all following the same file:
`http:` with `escalate: {after: 10, within: 10s, ban: 5m}` on remote_address.

latency  per trial a fresh client address floods HTTP on host A (GET /v1/check,
         keep-alive, 5/second allowed) while it sends a UDP probe to an echo server on
         host B every millisecond. The time from the client sending the request that gets
         its 10th 429 (the denial that bans) to the first probe host B drops (the last one
         answered + 1; probes are stamped after their send). Both ends err late, so every
         trial must be > 0. IPv4 and IPv6 trials alternate. Goal: p99 <= 1 s.
load     `--bans` prefixes (IPv4 /32 and /24, IPv6 /64 and /128, no two overlapping)
         written into a host's ban sets in one transaction (the kernel part of a load),
         read back; then the same list in Redis, a daemon restarted (the seconds from
         its start to READY=1 and to all the bans in its kernel; goal <= 1.5 s for
         100,000) and made to reconnect: read + index + kernel, as the daemon reports
         them. Per backend.
ready    `--bans` prefixes straight into Redis, host B's daemon restarted with its sets
         emptied (`--keep`: holding the list): seconds from its start to READY=1 (and the
         bans in its kernel then: all of them, the promise) and to all of them in its
         kernel (goal <= 1.5 s for 100,000, issue 35; docs/reliability.md). netlimitd
         runs as installed, its bytecode compiled (`--no-bytecode`: compiled at start,
         as on the .deb's first start).
write    (nftables; not in the default set) `--bans` prefixes written into host B's
         emptied sets, its daemon stopped, `--rounds` times each way, interleaved: in one
         transaction and in steps (kernel/nft/bansets.fill_in_steps, what a cold start
         does): seconds, the writer's system CPU and the host's memory taken at the peak
         (MemFree every 2 ms); each write read back whole (docs/reliability.md). Then
         the same list written over sets that hold another sharing a tenth of it (a
         start after a long stop, a reload after drift): whole in one transaction, and
         as sync_prefixes does it (the difference in steps, kernel/nft/bansets.diff_steps);
         and that difference handed to change() (netlimitd back from a long outage of
         the list's store): in one transaction (change() before stop 46) and in steps.
         Last, the list held with one address added by hand without a timeout: written
         whole in one transaction (before stop 47), and as sync_prefixes does it now
         (the address taken out in one small transaction, bansets.foreign_clearing).
outage   a client banned for 4 s; Redis is killed: host B keeps dropping it, then lets
         it through again when its time is up (measured against the expiry); Redis comes
         back empty and the daemons follow it again.
restart  host B's daemon restarted (on_stop: keep): the kernel's set is the same before
         and after, each prefix once.

--xdp    (nftables, with --only latency) both hosts' file has `xdp: {interfaces: [nlx0],
         mode: native}` on their LAN veth: the latency is then from the denial on host A to
         host B's XDP program dropping the probes, and the report adds host B's XDP counter
         of banned packets and its input chain's ban-rule counters (which must not move:
         a ban reaches the XDP map before the sets, docs/xdp.md).

Only namespaces this script creates are touched (nlb-<pid>-...); every loop is bounded
in count and time; everything is stopped in `finally`. Exit 1 when a promise is broken.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from redis import exceptions as redis_exceptions  # noqa: E402

from netlimit.bans.redis_store import ADD_LUA, RedisBanList, history_keys, keys  # noqa: E402 - after the sys.path entry
from netlimit.demo import check_status  # noqa: E402
from netlimit.kernel.banset import ban_sets  # noqa: E402
from netlimit.kernel.netns import run_in_netns  # noqa: E402
from netlimit.kernel.nft import elements as nfelements  # noqa: E402

EXE = str(Path(sys.executable).with_name("netlimit"))
#: netlimitd as systemd starts it (netlimit/daemon/main.py, no typer), from this tree
NETLIMITD = (
    [sys.executable, "-m", "netlimit.daemon"]
    if (REPO / "netlimit" / "daemon" / "__main__.py").exists()
    else [EXE, "daemon"]  # an older tree (this script copied into it for a comparison)
)
N = ipaddress.ip_network
A4, B4, A6, B6 = "198.18.0.1", "198.18.0.3", "2001:db8::1", "2001:db8::3"
HTTP_PORT, ECHO_PORT = 8080, 7007
AFTER = 10  # the escalation's `after`
PROBE_EVERY = 0.001

FILE = """\
version: 1
on_stop: keep
exempt: [127.0.0.0/8, "::1/128"]
bans:
  store: {store}
  max_entries: {max_entries}
http:
  domain: drills
  storage: {store}
  actions: [[remote_address]]
  descriptors:
    - key: remote_address
      rate_limit: {{unit: second, requests_per_unit: 5}}
      escalate: {{after: {after}, within: 10s, ban: 5m}}
"""

XDP = """\
xdp:
  interfaces: [nlx0]
  mode: {mode}
"""

ECHO = r"""
import select, socket, sys
socks = []
for fam, addr in ((socket.AF_INET, sys.argv[1]), (socket.AF_INET6, sys.argv[2])):
    s = socket.socket(fam, socket.SOCK_DGRAM)
    s.bind((addr, int(sys.argv[3])))
    socks.append(s)
while True:
    for s in select.select(socks, [], [], 1.0)[0]:
        data, peer = s.recvfrom(64)
        s.sendto(data, peer)
"""


def sh(*cmd: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=check)


def wait_for(pred, timeout: float, what: str, step: float = 0.02):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(step)
    raise TimeoutError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


# --- the fleet --------------------------------------------------------------------------------


@dataclass
class Fleet:
    tag: str
    tmp: Path
    backend: str
    max_entries: int
    ns: dict[str, str] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    clients4: list[str] = field(default_factory=list)
    clients6: list[str] = field(default_factory=list)
    xdp: bool = False

    @property
    def sock(self) -> str:
        return str(self.tmp / "redis.sock")

    @property
    def store(self) -> str:
        return f"unix://{self.sock}"

    @property
    def config(self) -> Path:
        return self.tmp / "netlimit.yaml"

    def daemon_sock(self, host: str) -> str:
        return str(self.tmp / f"netlimitd-{host}.sock")

    # processes
    def start_redis(self) -> None:
        # a killed redis leaves its socket file behind (stop_redis, the outage drill): gone
        # first, or the wait below finds the old path and pings before the new server binds
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.sock)
        self.procs["redis"] = subprocess.Popen(
            ["redis-server", "--port", "0", "--unixsocket", self.sock, "--unixsocketperm", "700", "--save", "",
             "--appendonly", "no", "--dir", str(self.tmp), "--logfile", str(self.tmp / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )  # fmt: skip
        wait_for(self._redis_answers, 10, "redis")

    def _redis_answers(self) -> bool:
        """The server answers a PING on its socket (refused or not there yet: False)."""
        if not os.path.exists(self.sock):
            return False
        lst = self.redis()
        try:
            return bool(lst.r.ping())
        except (OSError, redis_exceptions.ConnectionError):  # not listening yet
            return False
        finally:
            lst.close()

    def stop_redis(self) -> None:
        p = self.procs.pop("redis", None)
        if p is not None:
            p.kill()
            p.wait(timeout=10)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.sock)

    def redis(self) -> RedisBanList:
        return RedisBanList(self.store, max_entries=self.max_entries)

    def start_daemon(self, host: str) -> None:
        env = dict(os.environ, NETLIMIT_BACKEND=self.backend)
        log = open(self.tmp / f"daemon-{host}.log", "a")
        self.procs[f"daemon-{host}"] = subprocess.Popen(
            [*NETLIMITD, "--config", str(self.config), "--netns", self.ns[host], "--resync", "30",
             "--socket", self.daemon_sock(host)],
            stdout=subprocess.DEVNULL, stderr=log, env=env,
        )  # fmt: skip
        wait_for(lambda: (self.status(host) or {}).get("bans", {}).get("connected"), 30, f"daemon {host}", step=0.25)

    def timed_start(self, host: str, n: int, tree: Path | None = None, keep: bool = False) -> dict:
        """Start host's daemon under a NOTIFY_SOCKET of ours: seconds from its start to
        READY=1 (sd_notify; a thread of its own waits for it, so its time is exact) and
        how many bans the kernel holds then; and to the kernel holding all `n`: READY's
        time where they were all there, else the sets counted every 0.25 s after READY,
        each count timed at its start (an older netlimitd sent READY before the list was
        loaded). Nothing counts the sets before READY: a count is a dump of the sets,
        and one every 0.25 s during the daemon's write of 100,000 bans took a core of
        this 2-core host and the sets' lock from it, which no installed start has beside
        it. The set is emptied first, as after a reboot,
        unless `keep` (a restart after on_stop: keep or a crash: the kernel holds the
        list already). `tree`: the netlimit source tree the daemon runs from (default:
        this one)."""
        path = str(self.tmp / f"notify-{host}.sock")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        rx.bind(path)
        rx.settimeout(0.5)
        sets = ban_sets(self.backend)
        if not keep:
            run_in_netns(self.ns[host], lambda: sets.replace({}))
        env = dict(os.environ, NETLIMIT_BACKEND=self.backend, NOTIFY_SOCKET=path)
        if tree is not None:
            env["PYTHONPATH"] = str(tree)
        bytecode(env, tree or REPO, self.tmp)
        log = open(self.tmp / f"daemon-{host}.log", "a")
        got: dict = {}
        t0 = time.monotonic()
        deadline = t0 + 120

        def wait_ready() -> None:
            while time.monotonic() < deadline:
                try:
                    if b"READY=1" in rx.recv(4096):
                        got["ready"] = time.monotonic() - t0
                        got["cpu"] = cpu_seconds(self.procs[f"daemon-{host}"].pid)
                        got["at_ready"] = run_in_netns(self.ns[host], sets.count) or 0
                        return
                except TimeoutError:
                    continue

        waiter = threading.Thread(target=wait_ready, daemon=True)
        waiter.start()
        loaded = None
        try:
            self.procs[f"daemon-{host}"] = subprocess.Popen(
                [*NETLIMITD, "--config", str(self.config), "--netns", self.ns[host], "--resync", "30",
                 "--socket", self.daemon_sock(host)],
                stdout=subprocess.DEVNULL, stderr=log, env=env, cwd=tree,
            )  # fmt: skip
            while waiter.is_alive() and time.monotonic() < deadline:  # READY first, nothing counting
                waiter.join(0.25)
                if self.procs[f"daemon-{host}"].poll() is not None:
                    break
            if got.get("at_ready", 0) >= n:  # all there when READY came
                loaded = got["ready"]
            while loaded is None and time.monotonic() < deadline:
                t_count = time.monotonic()
                with contextlib.suppress(Exception):  # the sets may not exist yet
                    if (run_in_netns(self.ns[host], sets.count) or 0) >= n:
                        loaded = t_count - t0
                time.sleep(max(0.0, t_count + 0.25 - time.monotonic()))
            waiter.join(max(0.0, deadline - time.monotonic()))
        finally:
            rx.close()
        ready = got.get("ready")
        if ready is None or loaded is None:
            raise TimeoutError(f"daemon {host}: READY after {ready} s, {n} bans in the kernel after {loaded} s")
        return {
            "ready_s": round(ready, 3),
            "bans_in_kernel_s": round(loaded, 3),
            "in_kernel_at_ready": got["at_ready"],
            "cpu_at_ready_s": got.get("cpu"),
        }

    def stop_daemon(self, host: str) -> None:
        p = self.procs.pop(f"daemon-{host}", None)
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)

    def status(self, host: str) -> dict | None:
        from netlimit.daemon import query_status

        try:
            return query_status(self.daemon_sock(host), timeout=10)
        except (OSError, ValueError):
            return None

    def start_sidecars(self) -> None:
        """Two sidecars on host A sharing the Redis: one per address family (a listener
        serves one address)."""
        for fam, addr in ((4, A4), (6, f"[{A6}]")):
            log = open(self.tmp / f"sidecar{fam}.log", "a")
            self.procs[f"sidecar{fam}"] = subprocess.Popen(
                ["ip", "netns", "exec", self.ns["a"], EXE, "sidecar", "--config", str(self.config), "--listen",
                 f"{addr}:{HTTP_PORT}"],
                stdout=subprocess.DEVNULL, stderr=log,
            )  # fmt: skip

        def up(dst: str):
            try:
                s = in_ns(self.ns["c"], lambda: socket.create_connection((dst, HTTP_PORT), timeout=1))
                s.close()
                return True
            except OSError:
                return False

        for dst in (A4, A6):
            wait_for(lambda dst=dst: up(dst), 30, f"the sidecar on {dst}", step=0.2)

    def start_echo(self) -> None:
        self.procs["echo"] = subprocess.Popen(
            ["ip", "netns", "exec", self.ns["b"], sys.executable, "-c", ECHO, B4, B6, str(ECHO_PORT)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def kernel(self, host: str) -> dict:
        return run_in_netns(self.ns[host], lambda: ban_sets(self.backend).read()) or {}


def cpu_seconds(pid: int) -> float | None:
    """The CPU a process has used (user + system, every thread): what a start costs
    whatever the host's load (the wall time to READY=1 is that divided by the share of
    the cores it got)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 3)
    except (OSError, ValueError, IndexError):
        return None


def in_ns(ns: str, fn):
    """fn() in a thread inside `ns`: sockets it makes live there, wherever they are used."""
    return run_in_netns(ns, fn)


@contextlib.contextmanager
def fleet(backend: str, clients: int, max_entries: int, xdp: bool = False):
    tag = f"nlb-{os.getpid() % 100000}"
    tmp = Path(tempfile.mkdtemp(prefix="netlimit-bans-"))
    os.chmod(tmp, 0o700)
    f = Fleet(tag, tmp, backend, max_entries, xdp=xdp)
    try:
        for h in ("lan", "a", "b", "c"):
            f.ns[h] = f"{tag}-{h}"
            sh("ip", "netns", "add", f.ns[h])
            sh("ip", "-n", f.ns[h], "link", "set", "lo", "up")
        lan = f.ns["lan"]
        sh("ip", "-n", lan, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", lan, "link", "set", "br0", "up")
        f.clients4 = [f"198.18.0.{10 + i}" for i in range(clients)]
        # each IPv6 client in a /64 of its own (an escalation bans the source's /64), all on one /48 link
        f.clients6 = [f"2001:db8:0:{i + 1:x}::100" for i in range(clients)]
        for h, a4s, a6s in (("a", [A4], [A6]), ("b", [B4], [B6]), ("c", f.clients4, f.clients6)):
            ns = f.ns[h]
            sh("ip", "link", "add", f"{h}0", "netns", ns, "type", "veth", "peer", "name", f"l{h}", "netns", lan)
            sh("ip", "-n", lan, "link", "set", f"l{h}", "master", "br0")
            sh("ip", "-n", lan, "link", "set", f"l{h}", "up")
            if xdp and h != "c":  # one name on both hosts: the one file lists it
                sh("ip", "-n", ns, "link", "set", f"{h}0", "name", "nlx0")
            dev = "nlx0" if xdp and h != "c" else f"{h}0"
            for a in a4s:
                sh("ip", "-n", ns, "addr", "add", f"{a}/24", "dev", dev)
            for a in a6s:
                sh("ip", "-n", ns, "addr", "add", f"{a}/48", "dev", dev, "nodad")
            sh("ip", "-n", ns, "link", "set", dev, "up")
        f.config.write_text(
            FILE.format(store=f.store, max_entries=max_entries, after=AFTER)
            + (XDP.format(mode=os.environ.get("NETLIMIT_DRILL_XDP_MODE", "native")) if xdp else "")
        )
        f.start_redis()
        f.start_daemon("a")
        f.start_daemon("b")
        f.start_sidecars()
        f.start_echo()
        yield f
    finally:
        for name in list(f.procs):
            p = f.procs.pop(name)
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)
        if xdp:  # the daemons keep their pins (on_stop: keep, killed): unpin this fleet's
            for h in ("a", "b"):
                if h in f.ns:
                    sh(EXE, "flush", "--netns", f.ns[h], "-q", check=False, timeout=120)
        for ns in f.ns.values():
            sh("ip", "netns", "del", ns, check=False)
        shutil.rmtree(tmp, ignore_errors=True)


#: ready: netlimitd starts as installed, with netlimit's bytecode compiled (--no-bytecode: without)
BYTECODE = True
_compiled: set[Path] = set()


def bytecode(env: dict, tree: Path, tmp: Path) -> None:
    """A timed start's bytecode, in `env`. By default as installed: pip compiles a wheel's
    modules at install, the OCI image at its build, and netlimitd (root) writes its own on
    the .deb's first start, so a restart does not compile; `tree`'s are compiled here once
    (a source tree run with PYTHONDONTWRITEBYTECODE=1 has none, and its starts measured
    ~0.15-0.2 s of CPU compiling). --no-bytecode: every module compiled at the start
    (the .deb's first start: it ships no bytecode), from an empty cache nothing is written to."""
    if not BYTECODE:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["PYTHONPYCACHEPREFIX"] = str(tmp / "no-bytecode")  # empty: nothing found, nothing written
        return
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("PYTHONPYCACHEPREFIX", None)
    if tree not in _compiled:
        import compileall

        compileall.compile_dir(str(tree / "netlimit"), quiet=1)
        _compiled.add(tree)


# --- latency: Nth denial on A -> dropped on B -------------------------------------------------


class Prober:
    """UDP probes from `src` (in the client namespace) to B's echo server, one per ms."""

    def __init__(self, f: Fleet, src: str):
        fam = socket.AF_INET6 if ":" in src else socket.AF_INET
        dst = B6 if ":" in src else B4

        def make():
            s = socket.socket(fam, socket.SOCK_DGRAM)
            s.bind((src, 0))
            s.connect((dst, ECHO_PORT))
            s.settimeout(0.2)
            return s

        self.sock = in_ns(f.ns["c"], make)
        self.sent: list[float] = []
        self.answered: set[int] = set()
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._send, daemon=True),
            threading.Thread(target=self._recv, daemon=True),
        ]

    def __enter__(self) -> Prober:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(5)
        self.sock.close()

    def _send(self) -> None:
        seq = 0
        nxt = time.monotonic()
        while not self.stop.is_set() and seq < 200_000:
            now = time.monotonic()
            if now < nxt:
                time.sleep(nxt - now)
            with contextlib.suppress(OSError):
                self.sock.send(seq.to_bytes(4, "big"))
            # stamped after the send: a late stamp (the thread losing the GIL) can only make
            # a drop look later than it was, never earlier than the ban
            self.sent.append(time.monotonic())
            seq += 1
            nxt += PROBE_EVERY

    def _recv(self) -> None:
        while not self.stop.is_set():
            try:
                data = self.sock.recv(64)
            except (TimeoutError, OSError):
                continue
            if len(data) == 4:
                self.answered.add(int.from_bytes(data, "big"))

    def answering(self) -> bool:
        n = len(self.sent)
        return any(s in self.answered for s in range(max(0, n - 300), max(0, n - 50)))

    def first_answer_after(self, t: float) -> float | None:
        """The send time of the first probe sent after `t` that was answered."""
        sent = self.sent
        times = [sent[s] for s in list(self.answered) if s < len(sent) and sent[s] > t]
        return min(times) if times else None

    def dropped_since(self) -> float | None:
        """When the probes stopped getting through: the send time of the first one after
        the last answered (None: the last 200 sent are not all unanswered yet)."""
        n = len(self.sent)
        last = max(self.answered, default=-1)
        if n - last < 200:
            return None
        return self.sent[last + 1]


def trial(f: Fleet, src: str) -> dict:
    fam = socket.AF_INET6 if ":" in src else socket.AF_INET
    dst = A6 if ":" in src else A4

    def connect():
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.bind((src, 0))
        s.settimeout(5)
        s.connect((dst, HTTP_PORT))
        return s

    with Prober(f, src) as probe:
        wait_for(probe.answering, 10, "probes answered before the flood")
        http = in_ns(f.ns["c"], connect)
        denials = 0
        t0 = 0.0
        try:
            for _ in range(1000):
                # t0 is taken before the request is sent: the sidecar cannot ban before it has
                # the request, so no probe dropped for this ban is stamped earlier. (Taken
                # after the 429 was read, a client scheduled late under load saw probes
                # dropped "before" the ban: stop 40's red soak run.)
                sent_at = time.monotonic()
                if check_status(http, "a") == 429:
                    denials += 1
                    if denials == AFTER:
                        t0 = sent_at  # the request whose denial bans
                        break
        finally:
            http.close()
        if not t0:
            raise RuntimeError(f"{src}: {denials} denials in 1000 requests")
        t1 = wait_for(probe.dropped_since, 15, f"{src}'s probes dropped on host B", step=0.01)
    return {"client": src, "ms": round((t1 - t0) * 1000, 2)}


def latency(f: Fleet, trials: int) -> dict:
    rows = []
    for i in range(trials):
        src = f.clients6[i] if i % 2 else f.clients4[i]
        rows.append(trial(f, src))
    ms = [r["ms"] for r in rows]
    out = {
        "trials": rows,
        "p50_ms": round(pct(ms, 0.5), 2),
        "p99_ms": round(pct(ms, 0.99), 2),
        "max_ms": max(ms),
        "min_ms": min(ms),
        "mean_ms": round(statistics.mean(ms), 2),
        "ipv4_p50_ms": round(pct([r["ms"] for r in rows if ":" not in r["client"]] or [0], 0.5), 2),
        "ipv6_p50_ms": round(pct([r["ms"] for r in rows if ":" in r["client"]] or [0], 0.5), 2),
    }
    out["ok"] = all(r["ms"] > 0 for r in rows)
    return out


def xdp_drops(f: Fleet, host: str) -> dict:
    """Host's XDP counter of banned packets and its input chain's ban-rule counters
    (nftables: the rules that look up a bans set, in chain input)."""
    from netlimit.kernel.xdp import XdpPath

    with XdpPath(f.ns[host]) as p:
        banned = p.counters().banned
    listing = json.loads(
        sh("ip", "netns", "exec", f.ns[host], "nft", "-j", "list", "chain", "inet", "netlimit", "input").stdout
    )
    input_bans = 0
    for item in listing["nftables"]:
        exprs = item.get("rule", {}).get("expr", [])
        sets = {str(e["match"]["right"]) for e in exprs if "match" in e}
        if any(s in ("@bans4", "@bans6", "@banhosts4", "@banhosts6") for s in sets):
            input_bans += sum(e["counter"]["packets"] for e in exprs if "counter" in e)
    return {"xdp_banned": banned, "input_chain_bans": input_bans}


# --- load: a large list into the kernel -----------------------------------------------------------


def ban_elements() -> list:
    """Every element of the ban list's nftables sets (the addresses' hash sets and the
    prefixes' interval sets, both families): each start once means each ban once."""
    return [e for name in ("banhosts4", "bans4", "banhosts6", "bans6") for e in nfelements.read("netlimit", name) or []]


def many_bans(n: int, seed: int = 7) -> dict:
    """`n` prefixes, none inside another: IPv4 /32 and /24 (never in the same /24),
    IPv6 /64 (in 2001:db8::/32) and /128 (in 2001:db9::/32)."""
    rnd = random.Random(seed)
    out: dict = {}
    used24: set[int] = set()
    while len(out) < n:
        k = rnd.random()
        if k < 0.8:
            base = rnd.randrange(1 << 16, 0xDF0000)  # the number of a /24
            if base in used24 or base >> 16 in (127, 198):  # loopback is exempt; 198.18/15 is the fleet
                continue
            used24.add(base)
            net = (
                N(f"{ipaddress.IPv4Address(base << 8 | 7)}/32")
                if k < 0.6
                else N(f"{ipaddress.IPv4Address(base << 8)}/24")
            )
        elif k < 0.9:
            net = N(f"2001:db8:{rnd.randrange(1 << 16):x}:{rnd.randrange(1 << 16):x}::/64")
        else:
            net = N(f"2001:db9:{rnd.randrange(1 << 16):x}:{rnd.randrange(1 << 16):x}::7/128")
        out[net] = 3600.0
    return out


def counter(f: Fleet, host: str, name: str) -> int:
    """A counter of the host's daemon's ban status (-1: no answer)."""
    return int(((f.status(host) or {}).get("bans") or {}).get(name, -1))


def timings(f: Fleet, host: str) -> dict:
    return wait_for(lambda: ((f.status(host) or {}).get("bans") or {}).get("last_list"), 30, "a status", step=0.25)


def load(f: Fleet, n: int) -> dict:
    """The kernel part alone, then the whole path in a daemon: a restart (the whole set,
    one transaction) and a reconnect (the difference)."""
    bans = many_bans(n)
    sets = ban_sets(f.backend)
    host = f.ns["b"]
    f.stop_daemon("b")  # the set is ours alone for the kernel figure
    try:
        t0 = time.monotonic()
        run_in_netns(host, lambda: sets.replace(bans))
        write_s = time.monotonic() - t0
        t0 = time.monotonic()
        held = run_in_netns(host, sets.read) or {}
        read_s = time.monotonic() - t0
        kernel_ok = set(held) == set(bans)
        if f.backend == "nftables":
            starts = [e.key for e in run_in_netns(host, ban_elements) if not e.end]
            kernel_ok = kernel_ok and len(starts) == len(set(starts))
        run_in_netns(host, lambda: sets.replace({}))
    finally:
        f.start_daemon("b")
    lst = f.redis()
    try:
        lst.flush()
        pipe = lst.r.pipeline(transaction=False)
        script = lst.r.register_script(ADD_LUA)
        z, d, c, ch = keys("netlimit")
        r, rt = history_keys("netlimit")
        details = '{"rule":"","reason":"load drill"}'
        for i, net in enumerate(bans):
            # the add script's keys and arguments as RedisBanList.add passes them (no escalate.repeat)
            script(
                keys=[z, d, c, r, rt], args=[str(net), 3_600_000, details, f.max_entries, "0", ch, "", 0], client=pipe
            )
            if i % 5000 == 4999:
                pipe.execute()
        pipe.execute()
        wait_for(lambda: len(f.kernel("b")) == n, 120, "the list in host B's kernel", step=0.5)
        # a restart: the whole list read, indexed and written in one transaction; the time
        # from the daemon's start to READY=1 and to the bans in its kernel (issue 35: <= 1.5 s)
        f.stop_daemon("b")
        started = f.timed_start("b", n)
        restart = wait_for(lambda: counter(f, "b", "lists") >= 1 and timings(f, "b"), 60, "the load", step=0.25)
        restart = dict(restart, **started)
        restart_ok = len(f.kernel("b")) == n
        # a reconnect (Redis drops every subscriber): the list read again, the difference written
        before = wait_for(lambda: counter(f, "b", "lists") + 1, 30, "a status", step=0.25) - 1
        lst.r.client_kill_filter(_type="pubsub")
        wait_for(lambda: counter(f, "b", "lists") > before, 60, "the reconnect", step=0.25)
        reconnect = timings(f, "b")
        daemon_ok = restart_ok and len(f.kernel("b")) == n
        lst.flush()
        wait_for(lambda: not f.kernel("b"), 60, "the flush in host B's kernel", step=0.25)
    finally:
        lst.close()
    return {
        "bans": n,
        "kernel_write_s": round(write_s, 3),
        "kernel_read_s": round(read_s, 3),
        "daemon_restart": restart,
        "daemon_reconnect": reconnect,
        "ok": kernel_ok and daemon_ok,
    }


# --- ready: a restart's time to READY=1 with the list in the kernel ------------------------------


def ready(f: Fleet, n: int, rounds: int = 1, trees: list[Path] | None = None, keep: bool = False) -> dict:
    """`n` bans written straight into Redis (no channel messages: the daemons do not see
    them), host B's daemon restarted with its sets emptied (as after a reboot; `keep`:
    holding the list already, as after on_stop: keep or a crash): seconds from its start
    to READY=1, the bans its kernel holds then, and to all of them. `rounds` starts, each
    round one per tree in `trees` (interleaved: the host's load falls on all alike)."""
    lst = f.redis()
    runs: list[dict] = []
    try:
        lst.flush()
        z, d, _c, _ch = keys("netlimit")
        secs, _us = lst.r.time()
        exp = (int(secs) + 3600) * 1000
        pipe = lst.r.pipeline(transaction=False)
        details = '{"rule":"","reason":"ready drill","by":"drill","added":0,"origin":"manual"}'
        for i, net in enumerate(many_bans(n, seed=13)):
            pipe.zadd(z, {str(net): exp})
            pipe.hset(d, str(net), details)
            if i % 5000 == 4999:
                pipe.execute()
        pipe.execute()
        if keep:  # the kernel holds the list before the first timed start, as after a restart
            f.stop_daemon("b")
            f.timed_start("b", n)
        for r in range(rounds):
            for tree in trees or [None]:
                runs.append(dict(_ready_once(f, n, tree, keep), round=r + 1, tree=str(tree or REPO)))
        lst.flush()
        wait_for(lambda: not f.kernel("b"), 60, "the flush in host B's kernel", step=0.25)
    finally:
        lst.close()
    out = dict(runs[-1]) if len(runs) == 1 else {"runs": runs}
    return dict(out, bans=n, goal_s=1.5, keep=keep, ok=all(r["in_kernel_at_ready"] == n for r in runs))


def _ready_once(f: Fleet, n: int, tree: Path | None, keep: bool) -> dict:
    f.stop_daemon("b")
    load_avg = round(os.getloadavg()[0], 2)
    lines = (f.tmp / "daemon-b.log").read_text().count("\n") if (f.tmp / "daemon-b.log").exists() else 0
    out = f.timed_start("b", n, tree=tree, keep=keep)
    # printed at once: kept if what follows fails
    print(f"[{f.backend}] ready, the start ({tree or REPO}): {json.dumps(out)}", flush=True)
    wait_for(lambda: counter(f, "b", "lists") >= 1, 180, "the index after READY", step=0.25)  # a busy host: minutes
    # where the daemon's time went, by its own clock (netlimit/daemon/startphases.py)
    log = (f.tmp / "daemon-b.log").read_text().splitlines()[lines:]
    said = [ln.split("ready: ", 1)[1] for ln in log if "ready: " in ln]
    return dict(
        out,
        phases=(f.status("b") or {}).get("start_phases", {}),
        load_avg=load_avg,
        ready_line=said[-1] if said else None,
    )


# --- write: one transaction against steps ----------------------------------------------------------


def write(f: Fleet, n: int, rounds: int) -> dict:
    """The `write` drill (module doc): per way, the seconds, system CPU seconds and MiB
    taken at the peak of each write, and whether each read back whole."""
    import resource
    import threading

    from netlimit.kernel.nft.bansets import FILL_STEP

    f.stop_daemon("b")
    nets = sorted(many_bans(n, seed=13), key=lambda x: (x.version, int(x.network_address)))
    prefixes = [(x.version, int(x.network_address), x.prefixlen, 3600.0) for x in nets]
    sets = ban_sets(f.backend)
    ns = f.ns["b"]

    def free_kib() -> int:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemFree:"):
                    return int(line.split()[1])
        return 0

    def once(steps: bool) -> dict:
        run_in_netns(ns, lambda: sets.replace({}))
        return measure(lambda: sets.replace_prefixes(prefixes, empty=steps), nets)

    def over(stepped: bool) -> dict:
        """The list written into sets that hold another (a start after a long stop):
        sync_prefixes' difference in steps, or the whole write in one transaction (what
        it did before: a difference over half the list was written whole)."""
        run_in_netns(ns, lambda: sets.replace({}))
        run_in_netns(ns, lambda: sets.replace_prefixes(before, empty=True))
        if stepped:
            return measure(lambda: sets.sync_prefixes(prefixes), nets)
        return measure(lambda: sets.replace_prefixes(prefixes), nets)

    def change(stepped: bool) -> dict:
        """The difference from another held list handed to change(), as netlimitd does
        after a long outage of the list's store: in steps, or in one transaction (what
        change() did before stop 46)."""
        from netlimit.kernel.nft import elements as nfelements
        from netlimit.kernel.nft.bansets import _changes
        from netlimit.kernel.objects import NFT_FAMILY

        run_in_netns(ns, lambda: sets.replace({}))
        run_in_netns(ns, lambda: sets.replace_prefixes(before, empty=True))
        if stepped:
            return measure(lambda: sets.change(added, removed), nets)
        return measure(lambda: nfelements.write(_changes(added, removed, flush=False), NFT_FAMILY), nets)

    def foreign(cleared: bool) -> dict:
        """The list held, and one address added to it by hand without a timeout (`nft add
        element`): sync_prefixes takes it out in one small transaction and finds nothing
        else to write, or the whole write in one transaction (what it did before stop 47)."""
        run_in_netns(ns, lambda: sets.replace({}))
        run_in_netns(ns, lambda: sets.replace_prefixes(prefixes, empty=True))
        hand = next(str(a) for a in ipaddress.ip_network("198.51.100.0/24") if not any(a in x for x in nets))
        sh("ip", "netns", "exec", ns, "nft", "add", "element", "inet", "netlimit", "banhosts4", f"{{ {hand} }}")
        if cleared:
            return measure(lambda: sets.sync_prefixes(prefixes), nets)
        return measure(lambda: sets.replace_prefixes(prefixes), nets)

    def measure(fn, want: list) -> dict:
        low, done = [free_kib()], threading.Event()

        def sample() -> None:
            for _ in range(60_000):  # at most 2 min at one sample every 2 ms
                if done.wait(0.002):
                    return
                low[0] = min(low[0], free_kib())

        base = low[0]
        watcher = threading.Thread(target=sample, daemon=True)
        watcher.start()
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        try:
            what = run_in_netns(ns, fn)
        finally:
            seconds = time.monotonic() - t0
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            done.set()
            watcher.join(5)
        held = run_in_netns(ns, sets.read) or {}
        return {
            "s": round(seconds, 3),
            "sys_s": round(r1.ru_stime - r0.ru_stime, 3),
            "user_s": round(r1.ru_utime - r0.ru_utime, 3),
            "peak_mib": (base - low[0]) // 1024,
            "whole": set(held) == set(want),
            **({"steps": what["steps"]} if isinstance(what, dict) and "steps" in what else {}),
        }

    # another list of n, sharing a tenth of this one's prefixes
    other = sorted(many_bans(n, seed=14), key=lambda x: (x.version, int(x.network_address)))
    keep = set(nets[::10])
    other = sorted(keep | set(other[: n - len(keep)]), key=lambda x: (x.version, int(x.network_address)))
    before = [(x.version, int(x.network_address), x.prefixlen, 3600.0) for x in other]
    added = dict.fromkeys(set(nets) - set(other), 3600.0)
    removed = sorted(set(other) - set(nets), key=lambda x: (x.version, int(x.network_address)))
    ways = (
        "one_transaction", "steps", "over_whole", "over_diff_steps", "change_one_transaction", "change_steps",
        "foreign_whole", "foreign_cleared",
    )  # fmt: skip
    runs: dict[str, list[dict]] = {w: [] for w in ways}
    for _ in range(rounds):
        runs["one_transaction"].append(once(False))
        runs["steps"].append(once(True))
        runs["over_whole"].append(over(False))
        runs["over_diff_steps"].append(over(True))
        runs["change_one_transaction"].append(change(False))
        runs["change_steps"].append(change(True))
        runs["foreign_whole"].append(foreign(False))
        runs["foreign_cleared"].append(foreign(True))
    run_in_netns(ns, lambda: sets.replace({}))
    f.start_daemon("b")
    ok = all(r["whole"] for v in runs.values() for r in v)
    return {"bans": n, "fill_step": FILL_STEP, **runs, "ok": ok}


# --- outage: Redis down ----------------------------------------------------------------------------


def outage(f: Fleet) -> dict:
    src = f.clients4[-1]
    lst = f.redis()
    with Prober(f, src) as probe:
        wait_for(probe.answering, 10, "probes answered")
        lst.add(N(f"{src}/32"), 4.0, reason="outage drill")
        expires = time.monotonic() + 4.0
        lst.close()
        dropped = wait_for(probe.dropped_since, 10, "the ban on host B")
        f.stop_redis()
        wait_for(
            lambda: not (f.status("b") or {}).get("bans", {}).get("connected", True),
            15,
            "B to see Redis gone",
            step=0.25,
        )
        held_while_down = probe.first_answer_after(dropped) is None
        resumed = wait_for(lambda: probe.first_answer_after(dropped), 15, "the ban to end", step=0.005)
    late_ms = round((resumed - expires) * 1000, 1)
    f.start_redis()
    wait_for(lambda: (f.status("b") or {}).get("bans", {}).get("connected"), 30, "B back on Redis", step=0.25)
    wait_for(lambda: (f.status("a") or {}).get("bans", {}).get("connected"), 30, "A back on Redis", step=0.25)
    return {"held_while_redis_down": held_while_down, "ended_after_expiry_ms": late_ms,
            "ok": held_while_down and -100 <= late_ms <= 1500}  # fmt: skip


# --- restart -----------------------------------------------------------------------------------------


def restart(f: Fleet, n: int) -> dict:
    lst = f.redis()
    try:
        lst.flush()
        for net in list(many_bans(n, seed=11))[:n]:
            lst.add(net, 600.0, reason="restart drill")
        wait_for(lambda: len(f.kernel("b")) == n, 30, "the list in B's kernel", step=0.1)
        before = set(f.kernel("b"))
        f.stop_daemon("b")
        kept = set(f.kernel("b"))  # on_stop: keep
        f.start_daemon("b")
        wait_for(lambda: counter(f, "b", "loads") >= 1, 30, "the reload after the restart", step=0.25)
        after = f.kernel("b")
        dupes = 0
        if f.backend == "nftables":
            starts = [e.key for e in run_in_netns(f.ns["b"], ban_elements) if not e.end]
            dupes = len(starts) - len(set(starts))
        lst.flush()
    finally:
        lst.close()
    return {
        "bans": n,
        "same_set": before == set(after) and kept == before,
        "duplicates": dupes,
        "ok": before == set(after) and kept == before and dupes == 0,
    }


# --- main ----------------------------------------------------------------------------------------------


def run(backend: str, args) -> dict:
    out: dict = {"backend": backend}
    only = set(args.only.split(",")) if args.only else {"latency", "load", "ready", "outage", "restart"}
    with fleet(backend, max(args.trials, 2) + 2, max(args.bans, 1000) + 10, xdp=args.xdp) as f:
        if "latency" in only:
            out["latency"] = latency(f, args.trials)
            if args.xdp:  # every dropped probe dropped by host B's XDP, none by its input chain
                counts = xdp_drops(f, "b")
                out["latency"].update(counts)
                out["latency"]["ok"] &= counts["xdp_banned"] >= 200 * args.trials and counts["input_chain_bans"] == 0
            print(f"[{backend}] latency: {json.dumps({k: v for k, v in out['latency'].items() if k != 'trials'})}")
        if "load" in only:
            out["load"] = load(f, args.bans)
            print(f"[{backend}] load: {json.dumps(out['load'])}")
        if "ready" in only:
            trees = [Path(t).resolve() for t in args.tree] or None
            out["ready"] = ready(f, args.bans, rounds=args.rounds, trees=trees, keep=args.keep)
            print(f"[{backend}] ready: {json.dumps(out['ready'])}")
        if "write" in only and backend == "nftables":
            out["write"] = write(f, args.bans, max(1, args.rounds))
            print(f"[{backend}] write: {json.dumps(out['write'])}")
        if "outage" in only:
            out["outage"] = outage(f)
            print(f"[{backend}] outage: {json.dumps(out['outage'])}")
        if "restart" in only:
            out["restart"] = restart(f, min(args.bans, 2000))
            print(f"[{backend}] restart: {json.dumps(out['restart'])}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--bans", type=int, default=100_000)
    ap.add_argument("--backend", choices=("nftables", "restore", "both"), default="both")
    ap.add_argument("--only", default="", help="comma-separated: latency,load,ready,outage,restart,write")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--rounds", type=int, default=1, help="ready: starts per tree; write: writes each way")
    ap.add_argument("--tree", action="append", default=[], help="ready: netlimitd from this tree (repeat: interleaved)")
    ap.add_argument("--keep", action="store_true", help="ready: the kernel holds the list at start (on_stop: keep)")
    ap.add_argument("--xdp", action="store_true", help="host A and B drop in XDP (nftables, latency only)")
    ap.add_argument("--no-bytecode", action="store_true", help="ready: netlimitd compiles its modules at start")
    args = ap.parse_args()
    global BYTECODE
    BYTECODE = not args.no_bytecode
    if args.xdp and (args.backend != "nftables" or args.only != "latency"):
        print("ban_drills.py: --xdp goes with --backend nftables --only latency", file=sys.stderr)
        return 64
    if os.geteuid() != 0:
        print("ban_drills.py: run as root (it creates network namespaces)", file=sys.stderr)
        return 64
    for tool in ("redis-server", "nft", "ipset", "iptables-legacy-restore"):
        if not shutil.which(tool):
            print(f"ban_drills.py: {tool} is missing (scripts/setup.sh installs it)", file=sys.stderr)
            return 64
    backends = ("nftables", "restore") if args.backend == "both" else (args.backend,)
    results = [run(b, args) for b in backends]
    if args.json:
        args.json.write_text(json.dumps({"results": results}, indent=2))
    ok = all(part.get("ok", True) for r in results for part in r.values() if isinstance(part, dict))
    print("all promises kept" if ok else "A PROMISE WAS BROKEN")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
