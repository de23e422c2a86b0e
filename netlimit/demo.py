"""`netlimit demo`: rules/demo.yaml applied in a throw-away namespace, measured with real traffic.

Two namespaces (nldemo-<pid>-s / -c) joined by a veth pair; every packet stays
between them. Everything is torn down at the end, on error and on Ctrl-C.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import typer

from .errors import NetlimitError
from .kernel import traffic

SRV_IF, CLI_IF = "srv0", "cli0"
SRV4, CLI4, CLI4_EXEMPT = "198.18.0.1", "198.18.0.2", "198.18.0.3"
PAYLOAD = 1448 / 1514


class DemoError(NetlimitError):
    pass


class DemoInterrupted(NetlimitError):
    """Ctrl-C (SIGINT) or SIGTERM ended the demo; the namespaces are gone.
    `netlimit demo` exits 128 + the signal's number (130 for Ctrl-C, as shells expect)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _Interrupts:
    """SIGINT/SIGTERM handlers that remember the signal before raising KeyboardInterrupt.

    The remembered signal is what decides the outcome, not the exception: Python
    loses a KeyboardInterrupt raised while a finalizer (`__del__`, a weakref callback)
    happens to run ("Exception ignored in ..."), and a demo that had been told to stop
    then ran to its end and exited 0 (issue 35, on a busy host). `check()` between
    the phases and before the result turns a remembered signal into the interruption."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, object] = {}

    def _on_signal(self, signum, frame) -> None:
        first = self.signum is None
        self.signum = self.signum or signum
        if first:
            raise KeyboardInterrupt

    def __enter__(self) -> _Interrupts:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)  # type: ignore[arg-type]

    def check(self) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt


def demo_file(name: str = "demo.yaml") -> Path:
    """rules/NAME of the checkout, or of the installed package (<prefix>/share/netlimit/rules)."""
    from .install import find_share

    rules = find_share("rules")
    if rules is None or not (rules / name).exists():
        raise DemoError(f"rules/{name} not found (looked in the checkout's rules/ and <prefix>/share/netlimit/rules)")
    return rules / name


@dataclass
class Row:
    rule: str
    what: str
    configured: str
    measured: str
    ok: bool


class Progress:
    """One line that updates while traffic runs (plain lines when not a terminal)."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self._stop = threading.Event()
        self._th: threading.Thread | None = None

    def run(self, label: str, seconds: float):
        self.stop()
        self._stop.clear()
        start = time.monotonic()
        if not self.tty:
            print(f"[demo] {label} ({seconds:.0f} s) ...", file=sys.stderr, flush=True)
            return self

        def tick() -> None:
            while not self._stop.wait(0.2):
                el = time.monotonic() - start
                bar = int(20 * min(el / seconds, 1.0))
                sys.stderr.write(f"\r[demo] {label:<40} [{'#' * bar}{'.' * (20 - bar)}] {el:4.1f}/{seconds:.0f} s")
                sys.stderr.flush()

        self._th = threading.Thread(target=tick, daemon=True)
        self._th.start()
        return self

    def stop(self) -> None:
        if self._th is not None:
            self._stop.set()
            self._th.join()
            self._th = None
            sys.stderr.write("\r" + " " * 90 + "\r")
            sys.stderr.flush()


def _sh(*cmd: str) -> None:
    p = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        raise DemoError(f"{' '.join(cmd)}: {p.stderr.strip()}")


def _setup(srv: str, cli: str) -> None:
    for ns in (srv, cli):
        if os.path.exists(f"/run/netns/{ns}"):
            raise DemoError(f"namespace {ns} already exists")
    _sh("ip", "netns", "add", srv)
    _sh("ip", "netns", "add", cli)
    _sh("ip", "link", "add", SRV_IF, "netns", srv, "type", "veth", "peer", "name", CLI_IF, "netns", cli)
    for ns, dev, addrs in ((srv, SRV_IF, [SRV4]), (cli, CLI_IF, [CLI4, CLI4_EXEMPT])):
        _sh("ip", "-n", ns, "link", "set", "lo", "up")
        for a in addrs:
            _sh("ip", "-n", ns, "addr", "add", f"{a}/24", "dev", dev)
        _sh("ip", "-n", ns, "link", "set", dev, "up")


def _teardown(srv: str, cli: str) -> None:
    """Kill whatever still runs in the namespaces (a flood, a listener, iperf3 or the
    escalation's daemon and sidecar that an interruption left behind), then delete them."""
    for ns in (srv, cli):
        p = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30)
        for pid in p.stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ValueError, ProcessLookupError):
                pass
    for ns in (srv, cli):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def _counters(srv: str, sources: list[str], nft: bool) -> None:
    """One counting rule per source for what got through netlimit: in a table of the
    demo's own after netlimit's chain (nftables), or appended to INPUT (legacy)."""
    if nft:
        rules = "".join(f'\t\tip saddr {s} udp dport 5000 counter comment "demo-count-{s}"\n' for s in sources)
        script = f"table ip nldemo {{\n\tchain input {{\n\t\ttype filter hook input priority 100;\n{rules}\t}}\n}}\n"
        p = subprocess.run(
            ["ip", "netns", "exec", srv, "nft", "-f", "-"], input=script, capture_output=True, text=True, timeout=30
        )
        if p.returncode != 0:
            raise DemoError(f"nft -f: {p.stderr.strip()}")
        return
    ipt = traffic.need("iptables-legacy")
    for s in sources:
        rule = [
            "-s",
            s,
            "-p",
            "udp",
            "--dport",
            "5000",
            "-m",
            "comment",
            "--comment",
            f"demo-count-{s}",
            "-j",
            "ACCEPT",
        ]
        _sh("ip", "netns", "exec", srv, ipt, "-A", "INPUT", *rule)


def _count(srv: str, src: str, nft: bool) -> int:
    if nft:
        return traffic.nft_counter(srv, "ip nldemo", f"demo-count-{src}")
    return traffic.counter_by_comment(srv, f"demo-count-{src}")


NETLIMIT = [sys.executable, "-m", "netlimit.cli"]
HTTP_PORT = 8080
ESCALATE_AFTER = 10  # rules/demo-escalation.yaml


def _until(pred, timeout: float, what: str, step: float = 0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(step)
    raise DemoError(f"timed out after {timeout:g} s waiting for {what}")


def check_status(sock, host: str = "demo") -> int:
    """One GET /v1/check on a keep-alive connection; the answer's status, read with
    llhttp (httptools) up to the end of its message. ConnectionError when the peer closes."""
    import httptools

    sock.sendall(b"GET /v1/check HTTP/1.1\r\nHost: " + host.encode() + b"\r\n\r\n")
    done: list[bool] = []

    class _End:
        def on_message_complete(self) -> None:
            done.append(True)

    parser = httptools.HttpResponseParser(_End())
    while not done:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("the sidecar closed the connection")
        parser.feed_data(chunk)
    return parser.get_status_code()


def _escalation(srv: str, cli: str, nft: bool, backend: str) -> Row:
    """rules/demo-escalation.yaml: netlimitd (keeping the ban list) and a sidecar for the
    server; the client asks /v1/check until its 10th denial, then its packets are dropped."""
    import socket
    import tempfile

    from .daemon import query_status
    from .kernel.banset import ban_sets
    from .kernel.netns import run_in_netns

    work = Path(tempfile.mkdtemp(prefix="nldemo-"))
    sock = str(work / "netlimitd.sock")
    cfg = work / "escalation.yaml"
    cfg.write_text(demo_file("demo-escalation.yaml").read_text().replace("/run/netlimit/netlimitd.sock", sock))
    env = dict(os.environ, NETLIMIT_BACKEND=backend)
    procs: list[subprocess.Popen] = []
    try:
        log = open(work / "netlimitd.log", "w")  # noqa: SIM115 - the child writes it
        daemon = [*NETLIMIT, "daemon", "--config", str(cfg), "--netns", srv, "--socket", sock, "--resync", "60"]
        procs.append(subprocess.Popen(daemon, stdout=subprocess.DEVNULL, stderr=log, env=env))
        _until(lambda: os.path.exists(sock) and query_status(sock, timeout=2), 30, "netlimitd", step=0.1)
        sidecar = [*NETLIMIT, "sidecar", "--config", str(cfg), "--listen", f"{SRV4}:{HTTP_PORT}"]
        quiet = subprocess.DEVNULL
        procs.append(subprocess.Popen(["ip", "netns", "exec", srv, *sidecar], stdout=quiet, stderr=quiet))

        def connect():
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((CLI4, 0))
            s.settimeout(5)
            try:
                s.connect((SRV4, HTTP_PORT))
            except OSError:
                s.close()
                return None
            return s

        conn = _until(lambda: run_in_netns(cli, connect), 30, "the sidecar", step=0.2)
        denied = asked = 0
        t0 = 0.0
        try:
            while asked < 500 and not t0:
                asked += 1
                if check_status(conn) == 429:
                    denied += 1
                    if denied == ESCALATE_AFTER:
                        t0 = time.monotonic()  # the denial that bans
        except ConnectionError as exc:
            raise DemoError(str(exc)) from None
        finally:
            conn.close()
        me = ipaddress.ip_network(f"{CLI4}/32")
        sets = ban_sets(backend)
        _until(lambda: me in (run_in_netns(srv, sets.read) or {}), 10, "the ban in the kernel", step=0.002)
        ms = (time.monotonic() - t0) * 1000
        before = _count(srv, CLI4, nft)
        probe = traffic.udp_flood_start(cli, CLI4, SRV4, 5000, 100, 0.2)  # 20 packets, no rule limits them
        sent = traffic.flood_result(probe).sent
        time.sleep(0.2)
        delivered = _count(srv, CLI4, nft) - before
        return Row(
            "escalate",
            f"GET /v1/check from {CLI4}, 5/s",
            f"{ESCALATE_AFTER} denials in 10 s -> banned at L3 for 1m",
            f"banned within {ms:.0f} ms of the {ESCALATE_AFTER}th 429 ({asked} asked); "
            f"{delivered} of {sent} packets delivered",
            delivered == 0 and sent > 0,
        )
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)


def run_demo(duration: float = 4.0, keep: bool = False, out=None, backend: str | None = None) -> bool:
    """The demo on `backend` (default: what `apply` would pick here, auto)."""
    from .config.validate import ConfigError, load_file
    from .errors import NetlimitError
    from .kernel.compile import compile_config
    from .kernel.reconcile import ApplyError, apply
    from .kernel.registry import backend as backend_of
    from .kernel.registry import choose

    out = out or sys.stdout
    path = demo_file()
    try:
        loaded = load_file(path)
        choice = choose(backend, loaded.config.backend)
    except (ConfigError, NetlimitError) as exc:
        raise DemoError(str(exc)) from None
    chosen = backend_of(choice.key)
    nft = "nft" in chosen.tools  # the demo counts what got through with the backend's own tool
    for tool in ("iperf3", "ip", *chosen.tools):
        try:
            traffic.need(tool)
        except traffic.ToolMissing as exc:
            raise DemoError(str(exc)) from None
    desired = compile_config(loaded.config)
    srv, cli = f"nldemo-{os.getpid()}-s", f"nldemo-{os.getpid()}-c"
    prog = Progress()
    rows: list[Row] = []

    t_start = time.monotonic()
    intr = _Interrupts()
    failure: BaseException | None = None
    try:
        try:
            intr.__enter__()
            print(
                f"netlimit demo: namespaces {srv} (server, {SRV4}) and {cli} (client, {CLI4} and {CLI4_EXEMPT}), "
                f"rules from {path}",
                file=out,
            )
            print(f"backend: {choice.key} ({choice.why})", file=out)
            intr.check()
            _setup(srv, cli)
            intr.check()
            t0 = time.monotonic()
            try:
                res = apply(desired, srv, backend=choice.key)
            except ApplyError as exc:
                raise DemoError(f"apply failed: {exc}") from None
            c = res.changes.counts()
            how = chosen.write_unit
            print(f"applied {c['add']} objects in {time.monotonic() - t0:.2f} s ({choice.key} + tc, {how})\n", file=out)

            # 1. packet flood: limited source and exempt source at once
            intr.check()
            rows += _flood_rows(srv, cli, nft, duration, prog)

            # 2. new connections (recent) and concurrent connections (connlimit)
            intr.check()
            rows += _connection_rows(srv, cli, prog)

            # 3. bulk transfers: egress by port, ingress through the IFB device
            rows += _bandwidth_rows(srv, cli, duration, prog, intr)

            # 4. escalation: HTTP denials -> a ban in the kernel (netlimitd + a sidecar)
            intr.check()
            prog.run("escalation: http denials -> L3 ban", 5)
            rows.append(_escalation(srv, cli, nft, choice.key))
            prog.stop()
            intr.check()
        except KeyboardInterrupt:
            intr.signum = intr.signum or signal.SIGINT
        except (DemoError, traffic.ToolMissing, RuntimeError, subprocess.SubprocessError, OSError) as exc:
            failure = exc
    except KeyboardInterrupt:  # the first signal while an error was being noted (no later one raises)
        pass
    finally:
        _finish(prog, intr, keep, srv, cli, out)
    if intr.signum is not None:  # an error the interruption caused (a child killed) is the interruption
        name = signal.Signals(intr.signum).name
        print(f"\ninterrupted ({name}): namespaces {'kept' if keep else 'removed'}", file=out)
        raise DemoInterrupted(intr.signum)
    if failure is not None:
        raise DemoError(str(failure)) from None
    return _verdict(rows, time.monotonic() - t_start, keep, out)


def _flood_rows(srv: str, cli: str, nft: bool, duration: float, prog: Progress) -> list[Row]:
    """A UDP flood from a limited source and from an exempt one at once."""
    rate, burst, pps = 100, 10, 2000
    _counters(srv, [CLI4, CLI4_EXEMPT], nft)
    prog.run(f"udp flood {pps} pkt/s from 2 sources", duration)
    p1 = traffic.udp_flood_start(cli, CLI4, SRV4, 5000, pps, duration, times=True)
    p2 = traffic.udp_flood_start(cli, CLI4_EXEMPT, SRV4, 5000, pps, duration)
    r1, r2 = traffic.flood_result(p1), traffic.flood_result(p2)
    prog.stop()
    time.sleep(0.2)
    got, got_ex = _count(srv, CLI4, nft), _count(srv, CLI4_EXEMPT, nft)
    # the bucket replayed over the sends as they went: rate x T + burst when the sender kept
    # up; on a busy host it pauses, and a pause banks no more than the burst
    exp = traffic.bucket_passes(r1.times, rate, burst)
    nominal = rate * r1.duration + burst
    paused = f" (sender paused; rate x T + burst = {nominal:.0f})" if abs(exp - nominal) > 0.01 * nominal else ""
    return [
        Row(
            "udp-flood",
            "udp/5000, per source",
            f"{rate}/s + burst {burst} = {exp} in {r1.duration:.1f} s{paused}",
            f"{got} of {r1.sent} delivered",
            abs(got - exp) <= 0.01 * exp,
        ),
        Row(
            "(exempt)",
            f"same flood from {CLI4_EXEMPT}",
            "never limited",
            f"{got_ex} of {r2.sent} delivered",
            got_ex == r2.sent,
        ),
    ]


def _connection_rows(srv: str, cli: str, prog: Progress) -> list[Row]:
    """New connections (recent) and concurrent connections (connlimit)."""
    prog.run("tcp connection attempts", 7)
    l1 = traffic.tcp_listener(srv, SRV4, 2222, seconds=20)
    l2 = traffic.tcp_listener(srv, SRV4, 8081, seconds=20)
    try:
        nc = traffic.tcp_connects(cli, CLI4, SRV4, 2222, 5, timeout=1.0)
        mc = traffic.tcp_connects(cli, CLI4, SRV4, 8081, 3, timeout=1.0)
    finally:
        for lp in (l1, l2):
            lp.kill()
            lp.wait()
    prog.stop()

    def mark(lst: list[bool]) -> str:
        return " ".join("ok" if x else "x" for x in lst)

    return [
        Row(
            "new-conns",
            "tcp/2222 new connections",
            "3 per minute per source",
            f"{sum(nc)} of 5 accepted ({mark(nc)})",
            nc == [True, True, True, False, False],
        ),
        Row(
            "max-conns",
            "tcp/8081 concurrent",
            "2 per source",
            f"{sum(mc)} of 3 open ({mark(mc)})",
            mc == [True, True, False],
        ),
    ]


def _bandwidth_rows(srv: str, cli: str, duration: float, prog: Progress, intr: _Interrupts) -> list[Row]:
    """Bulk transfers: egress by port, ingress through the IFB device."""
    rows = []
    for name, port, reverse, bits, what in (
        ("bulk-out", 5201, True, 10e6, "server -> client, sport 5201"),
        ("uploads-in", 5202, False, 20e6, "client -> server, dport 5202 (IFB)"),
    ):
        intr.check()
        prog.run(f"iperf3 {what}", duration + 1)
        r = traffic.iperf3(srv, cli, SRV4, port=port, seconds=int(duration), reverse=reverse)
        prog.stop()
        conf = bits * PAYLOAD
        rows.append(
            Row(
                name,
                what,
                f"{bits / 1e6:g}mbit -> {conf / 1e6:.2f} goodput",
                f"{r.bits_per_second / 1e6:.2f} mbit/s ({100 * (r.bits_per_second / conf - 1):+.1f} %)",
                abs(r.bits_per_second - conf) <= 0.03 * conf,
            )
        )
    return rows


def _verdict(rows: list[Row], seconds: float, keep: bool, out) -> bool:
    """The table, and whether every measurement is within its tolerance."""
    print(format_rows(rows), file=out)
    ok = all(r.ok for r in rows)
    print(
        f"\n{'all within tolerance' if ok else 'SOME MEASUREMENTS MISSED'} "
        f"(packets ±1 %, bandwidth ±3 % of rate x 1448/1514); {seconds:.0f} s, "
        f"namespaces {'kept' if keep else 'removed'}",
        file=out,
    )
    return ok


def _finish(prog: Progress, intr: _Interrupts, keep: bool, srv: str, cli: str, out) -> None:
    """The clean-up of every ending. A signal during it is remembered, not raised (a
    second Ctrl-C does not cut it short); the first one, raised, restarts it (it is
    idempotent: kill what runs in the namespaces, delete them)."""
    try:
        for _ in range(3):  # only the first signal raises: two passes at most
            try:
                prog.stop()
                if keep:
                    print(
                        f"namespaces kept: {srv} {cli} (remove with: ip netns del {srv}; ip netns del {cli})", file=out
                    )
                else:
                    _teardown(srv, cli)
                return
            except KeyboardInterrupt:
                continue
    finally:
        intr.__exit__()


def format_rows(rows: list[Row]) -> str:
    heads = ("RULE", "WHAT", "CONFIGURED", "MEASURED", "")
    table = [heads] + [(r.rule, r.what, r.configured, r.measured, "ok" if r.ok else "MISS") for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(heads))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table)


def register(app: typer.Typer) -> None:
    """`netlimit demo` (netlimit/cli.py registers every layer's commands)."""
    from .kernel.cli import _backend_option

    @app.command()
    def demo(
        duration: float = typer.Option(4.0, "--seconds", min=1.0, max=10.0, help="Length of each traffic run."),
        keep: bool = typer.Option(False, "--keep", help="Leave the namespaces up for a look (then `ip netns del`)."),
        backend: str | None = _backend_option(),
    ) -> None:
        """Show netlimit working: two throw-away namespaces, rules/demo.yaml, real traffic,
        configured vs measured. Never touches this host's own namespace."""
        from . import cliutil as base
        from .kernel.cli import _need_root

        _need_root("demo")
        try:
            ok = run_demo(duration=duration, keep=keep, backend=backend)
        except DemoError as exc:
            base.err(f"error: {exc}")
            raise typer.Exit(base.EXIT_FAILED) from None
        except DemoInterrupted as exc:
            raise typer.Exit(128 + exc.signum) from None
        if not ok:
            raise typer.Exit(base.EXIT_FAILED)
