"""netlimitd's service loop: keep the kernel equal to the file.

One thread does all kernel work (python-iptables and pyroute2 are neither
thread-safe nor asyncio-friendly): the main loop. It waits in select() on
  - a watch of the config's directory (editors that rename work; see watch.py),
  - a self-pipe the signal handlers write to (SIGHUP reload, SIGTERM/SIGINT stop),
and wakes on timers for drift repair (--resync) and the systemd watchdog.
The status socket and the metrics endpoint run in their own threads and only
read a snapshot the main loop publishes (and, for counters, take the kernel
lock briefly).

A bad edit never removes protection: the new file is validated first and, if
invalid, rejected with every FILE:LINE:COL problem logged while the old rules
stay (see reload.py for what counts as a reload to distrust). On SIGTERM the
file's `on_stop` decides: flush (default) or keep. After a crash (kill -9) the
rules stay; the next start adopts them (apply is a diff).
"""

from __future__ import annotations

import faulthandler
import gc
import logging
import os
import select
import signal
import threading
import time
from collections import deque
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..logs import problem_fields
from ..reload import DropGuard
from ..watch import DirWatch, FileWatch
from .kernel_ops import KernelOps
from .readahead import discard_early
from .startphases import StartPhases
from .status import Status, open_status_socket, remove_status_socket, socket_path_problem

if TYPE_CHECKING:
    from .metrics import Metrics  # prometheus_client: imported only with --metrics (a start without is sooner)

log = logging.getLogger("netlimit.daemon")

#: control requests (the CLI's reload / standdown / resume) waiting at once, and
#: how long one waits for the main loop
MAX_CONTROLS = 4
CONTROL_TIMEOUT = 60.0
#: this many repairs on nftables notifications within NFT_STREAK_S seconds: the
#: notifications rest for NFT_QUIET_S (the periodic resync goes on)
NFT_STREAK = 5
NFT_STREAK_S = 10.0
NFT_QUIET_S = 60.0

#: A file beside the status socket that makes the next stop keep the rules, once,
#: whatever on_stop says. A package upgrade writes it before it restarts netlimitd
#: (debian/netlimit.postinst): the new daemon adopts the rules (an apply is a diff),
#: so the host is never without its limits while the software is replaced.
KEEP_ONCE = "keep-rules-on-next-stop"


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
        self.guard = DropGuard()  # holds back a file that would remove most rules (reload.py)
        self.recheck_at = 0.0  # when to look at a held file again (monotonic; 0: none held)
        self._watch: FileWatch | None = None  # made by start(), before the first apply; loop() takes it
        self._inc_watches: dict[str, DirWatch] = {}  # the directories of the file's include: entries
        self.bans: Any = None  # the ban follower (daemon/bans.py) while the file uses bans
        self.status.config_realpath = os.path.realpath(config_path)
        # requests of the CLI (reload, standdown, resume), run by the main loop
        self._controls: deque[dict[str, Any]] = deque()
        self._ctl_lock = threading.Lock()
        self._nft_watch: Any = None  # nft_watch.NftWatch while running
        self._nft_changed: str | None = None  # why the watch woke us (None: nothing new)
        self._nft_next = 0.0  # no nft-triggered check before (monotonic): at most 4 a second
        self._nft_streak: list[float] = []  # times of the recent nft-triggered repairs
        self._nft_quiet_until = 0.0  # notifications ignored until then (repairs that do not stick)

    # signals only record what happened and wake the loop
    def _on_signal(self, signum, _frame) -> None:
        self._pending.add(signum)
        try:
            os.write(self._wake_w, b"\0")
        except OSError:
            pass

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except OSError:  # a full pipe wakes the loop anyway
            pass

    # --- what the CLI asks: reload (apply of the daemon's own file), standdown (flush), resume

    def control_request(self, req: dict[str, Any]) -> dict[str, Any]:
        """A control request on the status socket (its thread): queued for the main
        loop, which does all kernel work; the answer waits for it (bounded)."""
        from .status import CONTROLS

        action = req.get("control")
        if action not in CONTROLS:
            return {"ok": False, "error": f"unknown request {action!r}: expected one of {', '.join(CONTROLS)}"}
        item: dict[str, Any] = {"action": action, "by": str(req.get("by", ""))[:100], "done": threading.Event()}
        with self._ctl_lock:
            if len(self._controls) >= MAX_CONTROLS:
                return {"ok": False, "error": f"busy: {MAX_CONTROLS} requests already wait"}
            self._controls.append(item)
        self._wake()
        if not item["done"].wait(CONTROL_TIMEOUT):
            return {"ok": False, "error": f"netlimitd did not get to the request within {CONTROL_TIMEOUT:g} s"}
        return item["result"]

    def _run_controls(self) -> None:
        while True:
            with self._ctl_lock:
                if not self._controls:
                    return
                item = self._controls.popleft()
            try:
                item["result"] = self._control(item["action"], item["by"])
            except Exception as exc:  # answered, never raised into the loop
                log.exception(f"{item['action']}: failed")
                item["result"] = {"ok": False, "error": f"{item['action']} failed: {exc}"}
            item["done"].set()

    def _control(self, action: str, by: str) -> dict[str, Any]:
        if action == "standdown":
            if self.status.stood_down:
                return {"ok": True, "summary": "already stood down", "status": self.status.summary()}
            if self.bans is not None:  # its sets go with the flush; it starts again on resume
                self.bans.close()
                self.bans = None
                if self.metrics:
                    self.metrics.follow_bans(None)
            res = self.kernel.flush()
            when = time.strftime("%Y-%m-%d %H:%M:%S %Z")
            self.status.stood_down = f"stood down by {by or 'flush'} at {when}, run `netlimit resume`"
            log.warning(f"{by or 'flush'}: standing down: {res['summary']}; no repairs until `netlimit resume`")
            self.notifier.status(self.status.summary())
            return {"ok": True, "summary": res["summary"], "status": self.status.summary()}
        # resume, reload: read the file and apply it (resuming when stood down)
        was = self.status.stood_down
        self.status.stood_down = None
        ok_before = self.status.reloads_ok
        why = "netlimit resume" if action == "resume" else f"{by or 'netlimit apply'}"
        if was:
            log.info(f"{why}: resuming ({was.split(',')[0]})")
        self.reload(why)
        ok = self.status.reloads_ok > ok_before
        out: dict[str, Any] = {"ok": ok, "summary": self.status.summary(), "result": self.status.last_apply_result}
        if not ok:
            out["error"] = self.status.rejected or self.status.held or self.status.last_apply_result
            rejected = self.status.rejected or ""
            out["invalid"] = bool(rejected) and not rejected.startswith("the kernel refused")
        return out

    def _on_nft_change(self, why: str) -> None:
        """The nft watch's thread: note it and wake the loop."""
        self.status.nft_events += 1
        self._nft_changed = why
        self._wake()

    def ban_request(self, req: dict[str, Any]) -> dict[str, Any]:
        """A ban request on the status socket (store: memory: this daemon keeps the list)."""
        bans = self.bans
        if bans is None:
            return {"ok": False, "error": "this netlimitd's file uses no bans (add a `bans:` section)"}
        return bans.request(req)

    def _bans_follow(self, config) -> None:
        """Start, keep or stop following the ban list as the file says."""
        if config.bans_on and self.bans is None:
            from .bans import BanFollower

            self.bans = BanFollower(config, self.kernel, self._wake)
            self.bans.start()
            if self.metrics:
                self.metrics.follow_bans(self.bans)
        elif config.bans_on:
            self.bans.configure(config)
        elif self.bans is not None:
            self.bans.close()
            self.bans = None
            if self.metrics:
                self.metrics.follow_bans(None)

    def status_payload(self) -> dict[str, Any]:
        d = asdict(self.status)
        d["summary"] = self.status.summary()
        bans = self.bans
        if bans is not None:
            d["bans"] = bans.status()
        try:  # the status answers while an apply waits on a lock: counters are then left out
            sizes = self.bans.kernel_sizes() if self.bans is not None else None
            d["counters"] = self.kernel.counters(wait=1.0, ban_sizes=sizes)
        except Exception as exc:  # a status never fails for its counters: any backend's read error is shown
            d["counters"] = []
            d["counters_error"] = str(exc)
        d["bandwidth"] = self.kernel.bandwidth()
        try:
            d["hot"] = self.kernel.hot()
        except Exception as exc:  # a status never fails for it
            d["hot"] = []
            d["hot_error"] = str(exc)
        return d

    def _apply(self, loaded, why: str) -> bool:
        t0 = time.monotonic()
        try:
            res = self.kernel.apply(loaded.config)
        except Exception as exc:  # the reconcile loop survives any failed apply: counted, reported, retried
            dt = time.monotonic() - t0
            self.status.applies_failed += 1
            self.status.last_apply_result = f"failed: {exc}"
            self.status.last_apply_time = time.time()
            self.status.last_apply_duration = dt
            if self.metrics:
                self.metrics.applies.labels("failed").inc()
                self.metrics.apply_seconds.observe(dt)
            log.error(f"{why}: apply failed, previous kernel state kept: {exc}")
            return False
        dt = time.monotonic() - t0
        self.status.last_apply_time = time.time()
        self.status.last_apply_duration = dt
        self.status.last_apply_result = "ok"
        self.status.last_apply_changes = int(res.get("changed", 0))
        self.status.backend, self.status.backend_reason = self.kernel.backend or "", self.kernel.backend_reason
        if self.bans is not None and res.get("changed"):
            self.bans.after_apply()
        if self.metrics:
            self.metrics.applies.labels("ok").inc()
            self.metrics.apply_seconds.observe(dt)
            self.metrics.last_apply.set(self.status.last_apply_time)
        log.info(f"{why}: {res.get('summary', 'applied')} in {dt * 1000:.0f} ms")
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

    def _lockout_warn(self, loaded, why: str) -> None:
        """The daemon has no session to protect: it applies the file, and says at
        warning level which rules could cut off sshd's ports (the CLI's guard)."""
        from ..kernel.lockout import lockout_hits, problems, sshd_listeners

        try:
            hits = lockout_hits(loaded.config, sshd_listeners(self.status.netns))
        except Exception as exc:  # a look at /proc must never stop a reload
            log.warning(f"{why}: cannot check for SSH lock-out: {exc!r}")
            return
        for p in problems(loaded, hits):
            log.warning(f"{why}: {p}")

    def start(self) -> int:
        from ..config.validate import ConfigError, load_file

        phases = StartPhases()

        # Before any kernel work: a SIGTERM or SIGHUP during the first apply is recorded
        # and handled by the loop (a default action would kill us with rules and no flush).
        for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        # The watch too: an edit that lands while the first apply runs is seen by the loop.
        self._watch = FileWatch(self.config_path)
        try:
            loaded = load_file(self.config_path)
        except ConfigError as exc:
            for p in exc.problems:
                log.error(str(p), extra=problem_fields(p))
            log.error(f"{self.config_path}: invalid, not starting ({len(exc.problems)} problems)")
            return 1
        phases.mark("config")
        problem = socket_path_problem(self.socket_path)
        if problem is not None:  # before the kernel is touched
            log.error(problem)
            return 1
        if self.metrics_addr:
            from .metrics import Metrics

            self.metrics = Metrics(self.kernel, self.status)
        self._lockout_warn(loaded, "start")
        if loaded.config.bans_on and loaded.config.ban_store != "memory":
            # the list's read (a thread) goes on while the first apply runs (issue 35)
            self._bans_follow(loaded.config)
        if not self._apply(loaded, "start"):
            return 2
        phases.mark("apply")
        self._adopt(loaded)
        self._bans_follow(loaded.config)
        self._status_srv = open_status_socket(self.socket_path, self)
        if self.bans is not None:  # READY=1 means the ban list is in the kernel (docs/reliability.md)
            # before the nft watch: the kernel makes no notification of 100,000 elements
            # nobody listens to (and the watch would read them all in Python)
            self.bans.wait_loaded(self._wake_r, lambda: bool(self._pending & {signal.SIGTERM, signal.SIGINT}))
            phases.mark("bans")
        self._start_nft_watch()
        if self.metrics and self.metrics_addr:
            self.metrics.serve(self.metrics_addr)
            log.info(f"metrics on http://{self.metrics_addr}/metrics")
        log.info(f"running: {self.status.summary()}; status socket {self.socket_path}")
        phases.mark("rest")
        discard_early()
        self.status.start_phases = phases.seconds()
        if self.bans is not None:
            log.info(f"ready: {phases.describe(self.bans.load_timings)}")
        self.notifier.ready(self.status.summary())
        return 0

    def _start_nft_watch(self) -> None:
        from .nft_watch import NftWatch

        watch = NftWatch(self.status.netns, self._on_nft_change)
        if watch.start():
            self._nft_watch = watch
        else:
            log.warning(f"{watch.error}; changes by others are found at the next resync ({self.resync:g} s)")
            watch.close()

    def _nft_check(self) -> None:
        """Someone touched netlimit's nftables table: compare and repair now."""
        why, self._nft_changed = self._nft_changed, None
        self._nft_next = time.monotonic() + 0.25
        if self.status.stood_down or self.loaded is None:
            return
        now = time.monotonic()
        if now < self._nft_quiet_until:
            return  # repairs that do not stick: the periodic resync goes on
        repairs = self.status.drift_repairs
        self.resync_once()
        if self.status.drift_repairs > repairs:
            self.status.nft_repairs += 1
            log.warning(f"{why}: repaired at once")
            # a repair that comes undone at once, again and again (another tool fighting
            # over the table, a kernel that reads back differently) must not loop 4 times
            # a second: after NFT_STREAK repairs within NFT_STREAK_S, notifications rest
            self._nft_streak = [t for t in self._nft_streak if now - t < NFT_STREAK_S] + [now]
            if len(self._nft_streak) >= NFT_STREAK:
                self._nft_quiet_until = now + NFT_QUIET_S
                self._nft_streak = []
                log.warning(
                    f"{NFT_STREAK} repairs within {NFT_STREAK_S:g} s: something keeps changing table inet "
                    f"netlimit; notifications ignored for {NFT_QUIET_S:g} s (the resync every {self.resync:g} s "
                    "goes on)"
                )

    def reload(self, why: str) -> None:
        from ..config.validate import ConfigError, load_file

        self.notifier.reloading()
        try:
            try:
                loaded = load_file(self.config_path)
            except ConfigError as exc:
                lines = [str(p) for p in exc.problems]
                for p in exc.problems:
                    log.error(f"{why}: rejected: {p}", extra=problem_fields(p))
                log.error(f"{why}: new config rejected, the old rules stay in place")
                self.status.rejected = "\n".join(lines)
                self.status.rejected_at = time.time()
                self.status.reloads_rejected += 1
                if self.metrics:
                    self.metrics.reloads.labels("rejected").inc()
                    self.metrics.rejected.set(1)
                return
            c = loaded.config
            names = [r.name for r in c.network] + [r.name for r in c.bandwidth]
            wait = self.guard.check(loaded.sha256, names, self.status.rules)
            if wait:
                gone = self.guard.removed(names, self.status.rules)
                log.warning(
                    f"{why}: {self.config_path} would remove {gone} of the {len(self.status.rules)} running "
                    f"rules; holding it back until it has stayed the same for {self.guard.settle:g} s "
                    "(a file caught half-written or truncated by mistake must not switch limits off)"
                )
                self.status.held = (
                    f"a file that would remove {gone} of {len(self.status.rules)} rules, "
                    f"held since {time.strftime('%H:%M:%S')}"
                )
                self.recheck_at = time.monotonic() + wait
                return
            if self.status.held:
                log.warning(f"{why}: the file still removes most rules after {self.guard.settle:g} s: applying it")
            self.status.held = None
            self.recheck_at = 0.0
            if self.loaded is not None and loaded.sha256 == self.loaded.sha256 and self.status.rejected is None:
                log.info(f"{why}: file unchanged; checking the kernel")
            self._lockout_warn(loaded, why)
            if self._apply(loaded, why):
                self._adopt(loaded)
                self._bans_follow(loaded.config)
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
        except Exception as exc:  # the resync loop survives any failed read of the kernel
            log.warning(f"resync: cannot read the kernel: {exc}")
            return
        self.status.last_drift_time = time.time()
        if self.bans is not None and not drift:
            ban_drift = self.bans.verify()  # the elements: not part of the rule set's diff
            if ban_drift:
                self.status.last_drift = ban_drift
                self.status.drift_repairs += 1
                if self.metrics:
                    self.metrics.repairs.inc()
        if not drift:
            return
        for d in drift:
            log.warning(f"drift: {d}")
        self.status.last_drift = drift[:50]
        if self._apply(self.loaded, "drift repair"):
            self.status.drift_repairs += 1
            if self.metrics:
                self.metrics.repairs.inc()
            self.notifier.status(self.status.summary())

    def loop(self) -> int:
        watch = self._watch if self._watch is not None else FileWatch(self.config_path)
        self._watch = None
        if not watch.uses_inotify:
            log.warning("inotify unavailable: polling the file every second")
        wd_interval = self.notifier.watchdog_usec / 2e6 if self.notifier.watchdog_usec else 0.0
        now = time.monotonic()
        next_resync = now + self.resync
        next_wd = now + wd_interval if wd_interval else float("inf")
        try:
            while True:
                now = time.monotonic()
                ban_at = self.bans.next_timer() if self.bans is not None else float("inf")
                nft_at = self._nft_next if self._nft_changed else float("inf")
                timeout = max(0.0, min(next_resync, next_wd, self.recheck_at or float("inf"), ban_at, nft_at) - now)
                if not watch.uses_inotify and timeout > 1.0:
                    timeout = 1.0
                incs = self._sync_include_watches()
                fds = [self._wake_r] + ([watch] if watch.uses_inotify else []) + [w for w in incs if w.uses_inotify]
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
                    if self.bans is not None:
                        self.bans.on_wake()
                if self.bans is not None:
                    self.bans.tick()
                pending, self._pending = self._pending, set()
                inc_changed = [w for w in incs if (w in ready or not w.uses_inotify) and w.changed()]  # drain each
                if pending & {signal.SIGTERM, signal.SIGINT}:
                    return self.stop("SIGTERM" if signal.SIGTERM in pending else "SIGINT")
                self._run_controls()
                down = self.status.stood_down is not None  # stood down: no reload, no repair
                if signal.SIGHUP in pending:
                    watch.changed()  # the reload reads the file anyway
                    if not down:
                        self.reload("SIGHUP")
                elif (watch in ready or not watch.uses_inotify) and watch.changed() and not down:
                    self.reload("file changed")
                elif inc_changed:
                    self.reload("included file changed")
                now = time.monotonic()
                if self.recheck_at and now >= self.recheck_at and not down:
                    self.recheck_at = 0.0
                    watch.changed()
                    self.reload("held file")
                if self._nft_changed and now >= self._nft_next:
                    self._nft_check()
                if now >= next_resync and not down:
                    self.resync_once()
                    next_resync = time.monotonic() + self.resync
                if now >= next_wd:
                    self.notifier.watchdog()
                    next_wd = now + wd_interval
        finally:
            watch.close()
            for w in self._inc_watches.values():
                w.close()
            self._inc_watches = {}

    def _sync_include_watches(self) -> list[DirWatch]:
        """Watch the directories the running file's `include:` entries name (an edit of
        conf.d/x.yaml reloads as an edit of the file does)."""
        patterns: list[str] = self.loaded.config.include if self.loaded is not None else []
        base = os.path.dirname(os.path.abspath(self.config_path))
        want = {os.path.dirname(os.path.join(base, os.path.expanduser(p))) for p in patterns}
        for d in [d for d in self._inc_watches if d not in want]:
            self._inc_watches.pop(d).close()
        for d in want - set(self._inc_watches):
            if os.path.isdir(d) and len(self._inc_watches) < 64:
                self._inc_watches[d] = DirWatch(d)
        return list(self._inc_watches.values())

    def stop(self, why: str) -> int:
        self.notifier.stopping()
        on_stop = self.loaded.config.on_stop if self.loaded is not None else "flush"
        if on_stop == "flush" and self._take_keep_once():
            on_stop = "keep"
            why = f"{why} ({KEEP_ONCE}: a restart)"
        rc = 0
        if on_stop == "flush":
            try:
                res = self.kernel.flush()
                log.info(f"{why}: on_stop flush: {res['summary']}")
            except Exception as exc:  # on stop, any failure of the flush is logged and becomes exit code 2
                log.error(f"{why}: flush failed: {exc}")
                rc = 2
        else:
            log.info(f"{why}: on_stop keep: rules stay in place")
            if self.bans is not None:
                log.info(
                    f"{why}: on_stop keep: {len(self.bans.index.shown)} bans stay in the kernel and expire on time"
                )
        self.close()
        return rc

    def _take_keep_once(self) -> bool:
        """True (and the marker removed) when KEEP_ONCE exists beside the status socket."""
        try:
            os.unlink(os.path.join(os.path.dirname(self.socket_path), KEEP_ONCE))
        except OSError:
            return False
        return True

    def close(self) -> None:
        if self._nft_watch is not None:
            self._nft_watch.close()
            self._nft_watch = None
        with self._ctl_lock:  # requests still waiting get an answer
            while self._controls:
                item = self._controls.popleft()
                item["result"] = {"ok": False, "error": "netlimitd is stopping"}
                item["done"].set()
        if self.bans is not None:
            self.bans.close()
            self.bans = None
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        if self._status_srv is not None:
            self._status_srv.shutdown()
            self._status_srv.server_close()
            remove_status_socket(self.socket_path)
            self._status_srv = None
        if self.metrics:
            self.metrics.close()
        self.notifier.close()


def run_daemon(
    config: Path, resync: float, netns: str | None, socket_path: str, metrics: str | None, backend: str | None = None
) -> int:
    d = Daemon(config, resync, netns, socket_path, metrics, backend=backend)
    # `kill -USR1` writes every thread's stack to stderr (the journal), from a C handler:
    # it answers even when the main thread is stuck in a call that never returns
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # No cyclic collector until READY=1: a start with 100,000 bans makes a million small
    # objects (the list's tuples, the elements), and the collector's passes over the
    # whole heap meanwhile took half the read's time (issue 35; daemon/main.py pauses it
    # from the imports on). The loop runs with it.
    gc.disable()
    try:
        rc = d.start()
    finally:
        gc.enable()
    if rc:
        d.close()
        return rc
    return d.loop()
