"""netlimitd: keep the kernel equal to the file.

One thread does all kernel work (python-iptables and pyroute2 are neither
thread-safe nor asyncio-friendly): the main loop. It waits in select() on
  - an inotify watch of the config's directory (editors that rename work),
  - a self-pipe the signal handlers write to (SIGHUP reload, SIGTERM/SIGINT stop),
and wakes on timers for drift repair (--resync) and the systemd watchdog.
The status socket and the metrics endpoint run in their own threads and only
read a snapshot the main loop publishes (and, for counters, take the kernel
lock briefly).

A bad edit never removes protection: the new file is validated first and, if
invalid, rejected with every FILE:LINE:COL problem logged while the old rules
stay. On SIGTERM the file's `on_stop` decides: flush (default) or keep. After a
crash (kill -9) the rules stay; the next start adopts them (apply is a diff).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import socketserver
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import typer

DEFAULT_SOCKET = "/run/netlimit/netlimitd.sock"


def log(msg: str) -> None:
    """One journal-friendly line on stderr (systemd adds time and unit)."""
    sys.stderr.write(f"netlimitd: {msg}\n")
    sys.stderr.flush()


# --- the kernel, behind one small facade ----------------------------------------


class KernelOps:
    """What the daemon needs from the kernel layer (netlimit.kernel.reconcile)."""

    def __init__(self, netns: str | None, backend: str | None = None):
        self.netns = netns
        self.flag = backend  # --backend; else $NETLIMIT_BACKEND, the file's `backend:`, auto
        self.backend: str | None = None  # the backend of the last apply
        self.backend_reason = ""
        self.desired: Any = None  # the last compiled config (Desired), to name tc objects in counters

    def _compile(self, config):
        from ..kernel.backends import choose
        from ..kernel.compile import compile_config

        choice = choose(self.flag, config.backend)
        if choice.key != self.backend:
            log(f"backend: {choice.key} ({choice.why})")
        self.backend, self.backend_reason = choice.key, choice.why
        self.desired = compile_config(config)
        return self.desired

    def apply(self, config) -> dict[str, Any]:
        """Make the kernel equal to `config` (a changed backend moves the rules: the new
        ones first). Raises (ApplyError ...) on failure, state rolled back."""
        from ..kernel import reconcile

        res = reconcile.apply(self._compile(config), self.netns, backend=self.backend)
        if not res.changed:
            return {"changed": 0, "summary": "no changes"}
        c = res.changes.counts()
        return {
            "changed": c["add"] + c["remove"] + c["reorder"],
            "summary": f"applied {c['add']} additions, {c['remove']} removals, {c['reorder']} moves",
        }

    def drift(self, config) -> list[str]:
        """How the kernel differs from `config`, as plan lines (empty: equal)."""
        from ..kernel import reconcile

        desired = self._compile(config)
        return reconcile.diff(desired, reconcile.read_owned(self.netns, backend=self.backend)).lines()

    def flush(self) -> dict[str, Any]:
        from ..kernel import reconcile

        st = reconcile.flush(self.netns, backend=self.backend or self.flag)
        return {"summary": "removed every owned object" if not st.empty else "nothing was installed"}

    def counters(self) -> list[dict[str, Any]]:
        """[{rule, layer, object, packets, bytes, dropped, ...}] for every owned object."""
        from ..kernel import reconcile

        return reconcile.list_owned(self.netns, self.desired, backend=self.backend or self.flag)


# --- state published to status / metrics ------------------------------------------


@dataclass
class Status:
    config_path: str
    pid: int = field(default_factory=os.getpid)
    started: float = field(default_factory=time.time)
    config_sha256: str = ""
    config_loaded_at: float = 0.0
    rules: list[str] = field(default_factory=list)
    last_apply_time: float = 0.0
    last_apply_result: str = "never"
    last_apply_duration: float = 0.0
    last_apply_changes: int = 0
    rejected: str | None = None  # why the newest file on disk is not running
    rejected_at: float = 0.0
    reloads_ok: int = 0
    reloads_rejected: int = 0
    applies_failed: int = 0
    drift_repairs: int = 0
    last_drift: list[str] = field(default_factory=list)
    last_drift_time: float = 0.0
    resync_interval: float = 30.0
    netns: str | None = None
    backend: str = ""  # the packet-filter backend in use, and why
    backend_reason: str = ""

    def summary(self) -> str:
        s = f"{len(self.rules)} rules from {self.config_path} ({self.config_sha256[:12]})"
        if self.rejected:
            first = self.rejected.splitlines()[0]
            s = f"running old config, new config rejected: {first}"
        if self.drift_repairs:
            s += f"; {self.drift_repairs} drift repairs"
        return s


class Metrics:
    """Prometheus metrics; rule counters are read from the kernel at scrape time."""

    def __init__(self, kernel: KernelOps, status: Status):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        self.kernel = kernel
        self.status = status
        self.apply_seconds = Histogram(
            "netlimit_apply_duration_seconds",
            "Duration of kernel applies",
            registry=self.registry,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.applies = Counter("netlimit_applies_total", "Kernel applies by result", ["result"], registry=self.registry)
        self.reloads = Counter(
            "netlimit_config_reloads_total", "Config reloads by result", ["result"], registry=self.registry
        )
        self.repairs = Counter(
            "netlimit_drift_repairs_total", "Drift repairs (kernel changed behind our back)", registry=self.registry
        )
        self.last_apply = Gauge(
            "netlimit_last_apply_timestamp_seconds", "Time of the last successful apply", registry=self.registry
        )
        self.rejected = Gauge(
            "netlimit_config_rejected",
            "1 when the file on disk was rejected and an older config is running",
            registry=self.registry,
        )
        for r in ("ok", "failed"):
            self.applies.labels(r)
        for r in ("ok", "rejected"):
            self.reloads.labels(r)
        self.registry.register(_RuleCollector(kernel))
        self._server: Any = None

    def serve(self, hostport: str) -> None:
        from prometheus_client import start_http_server

        host, _, port = hostport.rpartition(":")
        host = host.strip("[]") or "127.0.0.1"
        self._server, _thread = start_http_server(int(port), addr=host, registry=self.registry)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()


class _RuleCollector:
    def __init__(self, kernel: KernelOps):
        self.kernel = kernel

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        packets = CounterMetricFamily(
            "netlimit_rule_packets", "Packets matched per rule and layer", labels=["rule", "layer"]
        )
        bytes_ = CounterMetricFamily(
            "netlimit_rule_bytes", "Bytes matched per rule and layer", labels=["rule", "layer"]
        )
        dropped = CounterMetricFamily(
            "netlimit_rule_dropped_packets", "Packets dropped per rule and layer", labels=["rule", "layer"]
        )
        up = GaugeMetricFamily("netlimit_kernel_read_ok", "1 if the kernel counters could be read")
        try:
            rows = self.kernel.counters()
            ok = 1
        except Exception as exc:  # a scrape never crashes the daemon
            log(f"metrics: cannot read kernel counters: {exc}")
            rows, ok = [], 0
        agg: dict[tuple[str, str], list[int]] = {}
        for row in rows:
            k = (row["rule"], row["layer"])
            a = agg.setdefault(k, [0, 0, 0])
            a[0] += int(row.get("packets") or 0)
            a[1] += int(row.get("bytes") or 0)
            a[2] += int(row.get("dropped") or 0)
        for (rule, layer), (p, b, d) in sorted(agg.items()):
            packets.add_metric([rule, layer], p)
            bytes_.add_metric([rule, layer], b)
            dropped.add_metric([rule, layer], d)
        up.add_metric([], ok)
        yield packets
        yield bytes_
        yield dropped
        yield up


# --- the status socket --------------------------------------------------------------


class _StatusHandler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        daemon: Daemon = self.server.daemon_ref  # type: ignore[attr-defined]
        try:
            self.rfile.readline(256)
            payload = daemon.status_payload()
            self.wfile.write((json.dumps(payload) + "\n").encode())
        except Exception as exc:  # never let a client take the daemon down
            try:
                self.wfile.write((json.dumps({"error": str(exc)}) + "\n").encode())
            except OSError:
                pass


class _StatusServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = True


def open_status_socket(path: str, daemon: Daemon) -> _StatusServer:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(p.parent, 0o700)
    if p.exists() or p.is_symlink():
        # A stale socket from a crashed daemon; a live one would answer.
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(0.5)
                s.connect(str(p))
            raise RuntimeError(f"another netlimitd answers on {p}")
        except (TimeoutError, ConnectionRefusedError, FileNotFoundError):
            p.unlink()
    old = os.umask(0o177)
    try:
        srv = _StatusServer(str(p), _StatusHandler)
    finally:
        os.umask(old)
    os.chmod(p, 0o600)
    srv.daemon_ref = daemon  # type: ignore[attr-defined]
    threading.Thread(target=srv.serve_forever, name="status", daemon=True).start()
    return srv


def query_status(path: str = DEFAULT_SOCKET, timeout: float = 5.0) -> dict[str, Any] | None:
    """Ask a running daemon; None when no daemon answers."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(path)
            s.sendall(b"status\n")
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                buf += chunk
    except (FileNotFoundError, ConnectionRefusedError):
        return None
    return json.loads(buf.decode())


# --- the daemon ---------------------------------------------------------------------


class Daemon:
    def __init__(
        self,
        config_path: Path,
        resync: float,
        netns: str | None,
        socket_path: str,
        metrics_addr: str | None,
        notifier=None,
        backend: str | None = None,
    ):
        from ..sdnotify import Notifier

        self.config_path = config_path
        self.resync = resync
        self.kernel = KernelOps(netns, backend)
        self.socket_path = socket_path
        self.metrics_addr = metrics_addr
        self.notifier = notifier or Notifier()
        self.status = Status(config_path=str(config_path), resync_interval=resync, netns=netns)
        self.loaded = None
        self.metrics: Metrics | None = None
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._pending: set[int] = set()
        self._status_srv: Any = None

    # signals only record what happened and wake the loop
    def _on_signal(self, signum, _frame) -> None:
        self._pending.add(signum)
        try:
            os.write(self._wake_w, b"\0")
        except OSError:
            pass

    def status_payload(self) -> dict[str, Any]:
        d = asdict(self.status)
        d["summary"] = self.status.summary()
        try:
            d["counters"] = self.kernel.counters()
        except Exception as exc:
            d["counters"] = []
            d["counters_error"] = str(exc)
        return d

    def _apply(self, loaded, why: str) -> bool:
        t0 = time.monotonic()
        try:
            res = self.kernel.apply(loaded.config)
        except Exception as exc:
            dt = time.monotonic() - t0
            self.status.applies_failed += 1
            self.status.last_apply_result = f"failed: {exc}"
            self.status.last_apply_time = time.time()
            self.status.last_apply_duration = dt
            if self.metrics:
                self.metrics.applies.labels("failed").inc()
                self.metrics.apply_seconds.observe(dt)
            log(f"{why}: apply failed, previous kernel state kept: {exc}")
            return False
        dt = time.monotonic() - t0
        self.status.last_apply_time = time.time()
        self.status.last_apply_duration = dt
        self.status.last_apply_result = "ok"
        self.status.last_apply_changes = int(res.get("changed", 0))
        self.status.backend, self.status.backend_reason = self.kernel.backend or "", self.kernel.backend_reason
        if self.metrics:
            self.metrics.applies.labels("ok").inc()
            self.metrics.apply_seconds.observe(dt)
            self.metrics.last_apply.set(self.status.last_apply_time)
        log(f"{why}: {res.get('summary', 'applied')} in {dt * 1000:.0f} ms")
        return True

    def _adopt(self, loaded) -> None:
        self.loaded = loaded
        c = loaded.config
        self.status.config_sha256 = loaded.sha256
        self.status.config_loaded_at = time.time()
        self.status.rules = [r.name for r in c.network] + [r.name for r in c.bandwidth]
        self.status.rejected = None
        if self.metrics:
            self.metrics.rejected.set(0)

    def start(self) -> int:
        from ..config.validate import ConfigError, load_file

        try:
            loaded = load_file(self.config_path)
        except ConfigError as exc:
            for p in exc.problems:
                log(str(p))
            log(f"{self.config_path}: invalid, not starting ({len(exc.problems)} problems)")
            return 1
        if self.metrics_addr:
            self.metrics = Metrics(self.kernel, self.status)
        if not self._apply(loaded, "start"):
            return 2
        self._adopt(loaded)
        self._status_srv = open_status_socket(self.socket_path, self)
        if self.metrics and self.metrics_addr:
            self.metrics.serve(self.metrics_addr)
            log(f"metrics on http://{self.metrics_addr}/metrics")
        log(f"running: {self.status.summary()}; status socket {self.socket_path}")
        self.notifier.ready(self.status.summary())
        return 0

    def reload(self, why: str) -> None:
        from ..config.validate import ConfigError, load_file

        self.notifier.reloading()
        try:
            try:
                loaded = load_file(self.config_path)
            except ConfigError as exc:
                lines = [str(p) for p in exc.problems]
                for line in lines:
                    log(f"{why}: rejected: {line}")
                log(f"{why}: new config rejected, the old rules stay in place")
                self.status.rejected = "\n".join(lines)
                self.status.rejected_at = time.time()
                self.status.reloads_rejected += 1
                if self.metrics:
                    self.metrics.reloads.labels("rejected").inc()
                    self.metrics.rejected.set(1)
                return
            if self.loaded is not None and loaded.sha256 == self.loaded.sha256 and self.status.rejected is None:
                log(f"{why}: file unchanged; checking the kernel")
            if self._apply(loaded, why):
                self._adopt(loaded)
                self.status.reloads_ok += 1
                if self.metrics:
                    self.metrics.reloads.labels("ok").inc()
            else:
                self.status.reloads_rejected += 1
                self.status.rejected = f"the kernel refused it: {self.status.last_apply_result}"
                self.status.rejected_at = time.time()
                if self.metrics:
                    self.metrics.reloads.labels("rejected").inc()
                    self.metrics.rejected.set(1)
        finally:
            self.notifier.ready(self.status.summary())

    def resync_once(self) -> None:
        if self.loaded is None:
            return
        try:
            drift = self.kernel.drift(self.loaded.config)
        except Exception as exc:
            log(f"resync: cannot read the kernel: {exc}")
            return
        self.status.last_drift_time = time.time()
        if not drift:
            return
        for d in drift:
            log(f"drift: {d}")
        self.status.last_drift = drift[:50]
        if self._apply(self.loaded, "drift repair"):
            self.status.drift_repairs += 1
            if self.metrics:
                self.metrics.repairs.inc()
            self.notifier.status(self.status.summary())

    def loop(self) -> int:
        from ..watch import FileWatch

        watch = FileWatch(self.config_path)
        if not watch.uses_inotify:
            log("inotify unavailable: polling the file every second")
        for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        wd_interval = self.notifier.watchdog_usec / 2e6 if self.notifier.watchdog_usec else 0.0
        now = time.monotonic()
        next_resync = now + self.resync
        next_wd = now + wd_interval if wd_interval else float("inf")
        try:
            while True:
                now = time.monotonic()
                timeout = max(0.0, min(next_resync, next_wd) - now)
                if not watch.uses_inotify and timeout > 1.0:
                    timeout = 1.0
                fds = [self._wake_r] + ([watch] if watch.uses_inotify else [])
                try:
                    ready, _, _ = select.select(fds, [], [], timeout)
                except InterruptedError:
                    ready = []
                if self._wake_r in ready:
                    try:
                        while os.read(self._wake_r, 512):
                            pass
                    except BlockingIOError:
                        pass
                pending, self._pending = self._pending, set()
                if pending & {signal.SIGTERM, signal.SIGINT}:
                    return self.stop("SIGTERM" if signal.SIGTERM in pending else "SIGINT")
                if signal.SIGHUP in pending:
                    watch.changed()  # the reload reads the file anyway
                    self.reload("SIGHUP")
                elif watch in ready or not watch.uses_inotify:
                    time.sleep(0.1)  # let an editor finish writing before we read
                    if watch.changed():
                        self.reload("file changed")
                now = time.monotonic()
                if now >= next_resync:
                    self.resync_once()
                    next_resync = time.monotonic() + self.resync
                if now >= next_wd:
                    self.notifier.watchdog()
                    next_wd = now + wd_interval
        finally:
            watch.close()

    def stop(self, why: str) -> int:
        self.notifier.stopping()
        on_stop = self.loaded.config.on_stop if self.loaded is not None else "flush"
        rc = 0
        if on_stop == "flush":
            try:
                res = self.kernel.flush()
                log(f"{why}: on_stop flush: {res.get('summary', 'removed every owned object')}")
            except Exception as exc:
                log(f"{why}: flush failed: {exc}")
                rc = 2
        else:
            log(f"{why}: on_stop keep: rules stay in place")
        self.close()
        return rc

    def close(self) -> None:
        if self._status_srv is not None:
            self._status_srv.shutdown()
            self._status_srv.server_close()
            try:
                os.unlink(self.socket_path)
            except OSError:
                pass
            self._status_srv = None
        if self.metrics:
            self.metrics.close()
        self.notifier.close()


def run_daemon(
    config: Path, resync: float, netns: str | None, socket_path: str, metrics: str | None, backend: str | None = None
) -> int:
    d = Daemon(config, resync, netns, socket_path, metrics, backend=backend)
    rc = d.start()
    if rc:
        d.close()
        return rc
    return d.loop()


# --- CLI ------------------------------------------------------------------------------


def _fmt_time(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "never"


def register(app: typer.Typer) -> None:
    from ..cli import EXIT_USAGE, err

    @app.command()
    def daemon(
        config: Path = typer.Option(
            Path("/etc/netlimit/netlimit.yaml"), "--config", "-c", help="The file that is the truth."
        ),
        resync: float = typer.Option(30.0, "--resync", min=0.2, help="Seconds between drift checks (kernel vs file)."),
        metrics: str = typer.Option(
            None, "--metrics", metavar="HOST:PORT", help="Serve Prometheus metrics here (e.g. 127.0.0.1:9732)."
        ),
        netns: str = typer.Option(None, "--netns", help="Manage this network namespace instead of the host's."),
        socket_path: str = typer.Option(DEFAULT_SOCKET, "--socket", help="Status socket (0600)."),
        backend: str = typer.Option(
            None,
            "--backend",
            metavar="auto|nftables|restore|python-iptables",
            help="Packet-filter backend; default: $NETLIMIT_BACKEND, else the file's `backend:`, else auto.",
        ),
    ) -> None:
        """Run netlimitd: apply the file, reload on change or SIGHUP, repair drift (systemd Type=notify)."""
        if os.geteuid() != 0:
            err("netlimit daemon: must run as root (it changes iptables and tc)")
            raise typer.Exit(EXIT_USAGE)
        if metrics and ":" not in metrics:
            err(f"--metrics {metrics!r}: expected HOST:PORT, e.g. 127.0.0.1:9732")
            raise typer.Exit(EXIT_USAGE)
        raise typer.Exit(run_daemon(config, resync, netns, socket_path, metrics, backend))

    @app.command()
    def status(
        socket_path: str = typer.Option(DEFAULT_SOCKET, "--socket", help="The daemon's status socket."),
        as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
        netns: str = typer.Option(None, "--netns", help="Without a daemon: read this namespace's kernel."),
    ) -> None:
        """Ask the running daemon how it is; without one, read the kernel."""
        try:
            payload = query_status(socket_path)
        except PermissionError:
            err(f"netlimit status: {socket_path} is root-only (0600): run as root")
            raise typer.Exit(EXIT_USAGE) from None
        if payload is None:
            if as_json:
                out: dict[str, Any] = {"daemon": None}
                try:
                    out["counters"] = KernelOps(netns).counters()
                except Exception as exc:
                    out["error"] = str(exc)
                typer.echo(json.dumps(out, indent=2))
                return
            typer.echo(f"no daemon answers on {socket_path}; reading the kernel instead")
            try:
                rows = KernelOps(netns).counters()
            except Exception as exc:
                err(f"cannot read the kernel: {exc}")
                raise typer.Exit(2) from None
            _print_counters(rows)
            return
        if as_json:
            typer.echo(json.dumps(payload, indent=2))
            return
        s = payload
        typer.echo(f"netlimitd pid {s['pid']}, up since {_fmt_time(s['started'])}")
        typer.echo(
            f"  config:      {s['config_path']} sha256 {s['config_sha256'][:16]}…"
            f" loaded {_fmt_time(s['config_loaded_at'])}"
        )
        typer.echo(
            f"  last apply:  {_fmt_time(s['last_apply_time'])}: {s['last_apply_result']}"
            f" ({s['last_apply_duration'] * 1000:.0f} ms, {s['last_apply_changes']} changes)"
        )
        if s.get("backend"):
            typer.echo(f"  backend:     {s['backend']} ({s.get('backend_reason', '')})")
        if s.get("rejected"):
            typer.echo("  running old config, new config rejected:")
            for line in s["rejected"].splitlines():
                typer.echo(f"    {line}")
        typer.echo(f"  reloads:     {s['reloads_ok']} ok, {s['reloads_rejected']} rejected")
        typer.echo(f"  drift:       {s['drift_repairs']} repairs (resync every {s['resync_interval']:g} s)")
        for d in s.get("last_drift", [])[:10]:
            typer.echo(f"    last: {d}")
        _print_counters(s.get("counters", []))

    @app.command("install-service")
    def install_service(
        enable: bool = typer.Option(False, "--enable", help="Also `systemctl enable --now netlimitd`."),
        root: Path = typer.Option(Path("/"), "--root", help="Install into this root file system (staging)."),
    ) -> None:
        """Install the systemd units and a starter /etc/netlimit/netlimit.yaml, then daemon-reload."""
        from ..install import install

        if os.geteuid() != 0 and root == Path("/"):
            err("netlimit install-service: run as root (it writes /etc/systemd/system)")
            raise typer.Exit(EXIT_USAGE)
        raise typer.Exit(install(root=root, enable=enable, echo=typer.echo))


def _print_counters(rows: list[dict[str, Any]]) -> None:
    if not rows:
        typer.echo("  no objects owned by netlimit")
        return
    typer.echo(f"  {'rule':<24} {'layer':<9} {'packets':>12} {'bytes':>14} {'dropped':>10}")
    agg: dict[tuple[str, str], list[int]] = {}
    for r in rows:
        a = agg.setdefault((r["rule"], r["layer"]), [0, 0, 0])
        a[0] += int(r.get("packets") or 0)
        a[1] += int(r.get("bytes") or 0)
        a[2] += int(r.get("dropped") or 0)
    for (rule, layer), (p, b, d) in agg.items():
        typer.echo(f"  {rule:<24} {layer:<9} {p:>12} {b:>14} {d:>10}")
