"""`netlimit sidecar --workers N` (N > 1): a supervisor and N worker processes.

Each worker is a whole sidecar (server.run) whose listeners -- the
client-facing one, ``--admin-listen``, ``--grpc`` -- bind with ``SO_REUSEPORT``:
one socket per worker on the same port, the kernel spreading new connections
over them.  The supervisor (this module, no event loop):

* holds a bound, never listening socket on each port (so ``:0`` becomes one
  port all workers share, and no other program takes it while a worker restarts);
* with the memory store, starts the state owner (stores/shared.py) the workers
  lease from over a Unix socket in a 0700 directory; with Redis the store is
  shared already;
* restarts a worker (or the owner) that died, after 0.1 s doubling to 5 s at
  most while it keeps dying within 10 s of its start, and logs it;
* forwards SIGHUP to every worker (each reloads; a bad file keeps its rules);
* on SIGTERM / SIGINT stops every child and waits for them (STOP_DEADLINE),
  then kills what is left.  Children get PR_SET_PDEATHSIG(SIGTERM): a
  supervisor killed with SIGKILL leaves no worker behind.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ..listen import format_hostport, parse_listen

log = logging.getLogger("netlimit.sidecar")

#: how long a stop waits for the children before killing them (a worker's own grace is 5 s)
STOP_DEADLINE = 8.0
#: restart backoff: first delay, cap, and how long a child must live to reset it
BACKOFF_FIRST, BACKOFF_MAX, BACKOFF_RESET = 0.1, 5.0, 10.0
_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD)
_PR_SET_PDEATHSIG = 1


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass
class _Child:
    name: str
    argv: list[str]
    proc: subprocess.Popen | None = None
    started: float = 0.0
    failures: int = 0
    due: float = 0.0  # when a dead child is started again (monotonic)
    extra: dict[str, Any] = field(default_factory=dict)


def _hold(host: str, port: int) -> socket.socket:
    """A bound, not listening SO_REUSEPORT socket: the port the workers share."""
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        s.bind((host, port))
    except OSError as exc:
        s.close()
        raise SystemExit(f"cannot listen on {format_hostport(host, port)}: {exc.strerror or exc}") from None
    return s


def _child_setup(parent: int) -> None:
    """In the child before exec: die with the supervisor, take signals again."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - Linux has prctl
        pass
    if os.getppid() != parent:  # the supervisor died before prctl
        os._exit(1)


class Supervisor:
    def __init__(self, o: Any, n: int, log_level: str, log_format: str) -> None:
        self.o = o
        self.n = n
        self.held: list[socket.socket] = []
        self.tmp: str | None = None
        self.children: list[_Child] = []
        self.log_level = log_level
        self.log_format = log_format
        self.pid = os.getpid()

    def _resolve(self, what: str | None, flag: str) -> str | None:
        if what is None:
            return None
        host, port = parse_listen(what, flag)
        s = _hold(host, port)
        self.held.append(s)
        return format_hostport(host, s.getsockname()[1])

    def prepare(self, storage: str, max_keys: int, max_key_length: int) -> None:
        o = self.o
        o.listen = self._resolve(o.listen, "--listen")
        admin = o.admin_listen if o.admin_listen is not None or o.upstream is None else "127.0.0.1:8182"
        o.admin_listen = self._resolve(admin, "--admin-listen")
        o.grpc = self._resolve(o.grpc, "--grpc")
        py = [sys.executable, "-m", "netlimit.sidecar.worker_main"]
        # the workers' sockets (peers.py: /metrics and /v1/top of all) and the state owner's
        self.tmp = tempfile.mkdtemp(prefix="netlimit-sidecar-")
        os.chmod(self.tmp, 0o700)
        o.peer_dir = self.tmp
        if storage == "memory":
            o.shared_state = os.path.join(self.tmp, "state.sock")
            owner = json.dumps({"owner": o.shared_state, "max_keys": max_keys, "max_key_length": max_key_length,
                                "log_level": self.log_level, "log_format": self.log_format})  # fmt: skip
            self.children.append(_Child("state owner", [*py, owner]))
        o.workers = self.n
        # NETLIMIT_SHARED_LEASES=0: one round trip to the owner per decision (the measured alternative)
        o.shared_leases = os.environ.get("NETLIMIT_SHARED_LEASES", "1") != "0"
        for i in range(self.n):
            o.worker = i
            doc = {"options": asdict(o), "log_level": self.log_level, "log_format": self.log_format}
            self.children.append(_Child(f"worker {i}", [*py, json.dumps(doc)]))

    def _start(self, c: _Child) -> subprocess.Popen:
        # preexec_fn: the supervisor has no threads (PDEATHSIG must be set in the child)
        c.proc = subprocess.Popen(c.argv, preexec_fn=lambda: _child_setup(self.pid), close_fds=True)  # noqa: PLW1509
        c.started = time.monotonic()
        c.due = 0.0
        return c.proc

    def _wait_owner(self, deadline: float) -> None:
        path = self.o.shared_state
        owner = self.children[0]
        while time.monotonic() < deadline:
            if os.path.exists(path):
                return
            if owner.proc is not None and owner.proc.poll() is not None:
                raise SystemExit(f"the shared state's owner exited with {owner.proc.returncode}")
            time.sleep(0.01)
        raise SystemExit(f"the shared state's owner did not start within 10 s ({path})")

    def run(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        try:
            for c in self.children:
                self._start(c)
                if c.name == "state owner":
                    self._wait_owner(time.monotonic() + 10.0)
            log.info(
                "supervisor %d: %d workers on %s (SO_REUSEPORT)%s",
                self.pid,
                self.n,
                self.o.listen,
                "; memory store shared through the state owner" if self.o.shared_state else "",
            )
            self._loop()
        finally:
            self._stop_all()
            for s in self.held:
                s.close()
            if self.tmp is not None:
                shutil.rmtree(self.tmp, ignore_errors=True)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)

    def _loop(self) -> None:
        while True:
            now = time.monotonic()
            due = [c.due for c in self.children if c.proc is None]
            wait = max(0.0, min(due) - now) if due else 1.0
            info = signal.sigtimedwait(_SIGNALS, min(wait, 1.0))
            if info is not None:
                sig = info.si_signo
                if sig in (signal.SIGTERM, signal.SIGINT):
                    log.info("supervisor: %s: stopping %d workers", signal.Signals(sig).name, self.n)
                    return
                if sig == signal.SIGHUP:
                    log.info("supervisor: SIGHUP: reloading every worker")
                    for c in self.children:
                        if c.proc is not None and c.proc.poll() is None and c.name != "state owner":
                            c.proc.send_signal(signal.SIGHUP)
            self._reap()

    def _reap(self) -> None:
        now = time.monotonic()
        for c in self.children:
            if c.proc is not None and c.proc.poll() is not None:
                code = c.proc.returncode
                lived = now - c.started
                c.failures = 0 if lived >= BACKOFF_RESET else c.failures + 1
                delay = 0.0 if not c.failures else min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** (c.failures - 1))
                how = f"signal {signal.Signals(-code).name}" if code < 0 else f"status {code}"
                log.error(
                    "%s (pid %d) exited with %s after %.1f s; restarting it in %.1f s%s",
                    c.name,
                    c.proc.pid,
                    how,
                    lived,
                    delay,
                    " (its counters are lost: limits start afresh)" if c.name == "state owner" else "",
                )
                c.proc = None
                c.due = now + delay
            if c.proc is None and now >= c.due:
                proc = self._start(c)
                log.info("%s started again (pid %d)", c.name, proc.pid)

    def _stop_all(self) -> None:
        # workers first (they give their leases back to the owner), then the owner
        workers = [c for c in self.children if c.name != "state owner" and c.proc is not None]
        owners = [c for c in self.children if c.name == "state owner" and c.proc is not None]
        for group in (workers, owners):
            for c in group:
                if c.proc is not None and c.proc.poll() is None:
                    c.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + STOP_DEADLINE
            for c in group:
                assert c.proc is not None
                try:
                    c.proc.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    log.error("%s (pid %d) did not stop within %g s: killed", c.name, c.proc.pid, STOP_DEADLINE)
                    c.proc.kill()
                    c.proc.wait()


def supervise(o: Any) -> None:
    """Run ``o.workers`` workers under a supervisor until SIGTERM / SIGINT.
    ConfigError (the file is checked here first) and SystemExit as server.run."""
    from ..config.validate import load_file

    loaded = load_file(o.config)  # ConfigError to the caller: nothing started
    http = loaded.config.http
    assert http is not None
    storage = o.redis or http.storage
    sup = Supervisor(o, o.workers, o.log_level, o.log_format)
    sup.prepare(storage, http.max_keys, http.max_key_length)
    sup.run()
