"""The daemon's state as `netlimit status` sees it: the Status record the main
loop publishes, the status socket (a root-only Unix socket, one JSON document
per connection) and its client."""

from __future__ import annotations

import io
import json
import os
import socket
import socketserver
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

#: the longest request line a client may send (a ban request, JSON from
#: netlimit.bans.socket_client, is the longest), the most time it may take, and
#: how many clients are served at once (more are closed at once)
MAX_REQUEST = 4096
CLIENT_TIMEOUT = 5.0
MAX_CLIENTS = 8


class DeadlineReader(io.RawIOBase):
    """A socket's reading side that ends at a deadline: each read may wait only for
    the time left, so a client trickling a byte every few seconds cannot hold its
    thread past the deadline (a per-read timeout would let it)."""

    def __init__(self, sock: socket.socket, deadline: float):
        self.sock = sock
        self.deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not arrive in time")
        self.sock.settimeout(left)
        return self.sock.recv_into(b)


class StatusSource(Protocol):
    def status_payload(self) -> dict[str, Any]: ...
    def ban_request(self, req: dict[str, Any]) -> dict[str, Any]: ...
    def control_request(self, req: dict[str, Any]) -> dict[str, Any]: ...


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
    held: str | None = None  # a valid file held back because it would remove most rules (reload.py)
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
    #: set by `netlimit flush` (the daemon removed its objects and stays down until `netlimit resume`)
    stood_down: str | None = None
    #: the config file's absolute path (the CLI compares it with the file it is given)
    config_realpath: str = ""
    #: nftables notifications about netlimit's table seen, and repairs they led to
    nft_events: int = 0
    nft_repairs: int = 0
    #: where the start's time went up to READY=1, seconds (service.StartPhases)
    start_phases: dict[str, float] = field(default_factory=dict)

    def summary(self) -> str:
        if self.stood_down:
            return self.stood_down
        s = f"{len(self.rules)} rules from {self.config_path} ({self.config_sha256[:12]})"
        if self.rejected:
            first = self.rejected.splitlines()[0]
            s = f"running old config, new config rejected: {first}"
        elif self.held:
            s += f"; new config held: {self.held}"
        if self.drift_repairs:
            s += f"; {self.drift_repairs} drift repairs"
        return s


class _StatusHandler(socketserver.StreamRequestHandler):
    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the socket stays open: read it through the deadline instead
        # a client that never sends its line, or trickles it, cannot hold a thread
        self.rfile = io.BufferedReader(DeadlineReader(self.connection, time.monotonic() + CLIENT_TIMEOUT))

    def handle(self) -> None:
        daemon: StatusSource = self.server.daemon_ref  # type: ignore[attr-defined]
        try:
            line = self.rfile.readline(MAX_REQUEST)
            self.connection.settimeout(CLIENT_TIMEOUT)  # the answer's own timeout
            ctl = _control_request(line)
            req = _ban_request(line) if ctl is None else None
            if ctl is not None:
                payload = daemon.control_request(ctl)
            else:
                payload = daemon.ban_request(req) if req is not None else daemon.status_payload()
            self.wfile.write((json.dumps(payload) + "\n").encode())
        except Exception as exc:  # never let a client take the daemon down
            try:
                self.wfile.write((json.dumps({"error": str(exc)}) + "\n").encode())
            except OSError:
                pass


#: what the CLI may ask of the daemon (netlimit apply / flush / resume)
CONTROLS = ("reload", "standdown", "resume")


def _control_request(line: bytes) -> dict[str, Any] | None:
    """A JSON request with a "control" field (reload, standdown, resume); None otherwise."""
    if not line.lstrip().startswith(b"{"):
        return None
    try:
        req = json.loads(line)
    except ValueError:
        return None
    return req if isinstance(req, dict) and "control" in req else None


def _ban_request(line: bytes) -> dict[str, Any] | None:
    """A JSON request with a "ban" field (None: a status request, e.g. `status\n`)."""
    if not line.lstrip().startswith(b"{"):
        return None
    try:
        req = json.loads(line)
    except ValueError:
        return {"ban": None}
    return req if isinstance(req, dict) and "ban" in req else {"ban": None}


class _StatusServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.slots = threading.BoundedSemaphore(MAX_CLIENTS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)  # too many at once: this one is closed
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


def open_status_socket(path: str, daemon: StatusSource) -> _StatusServer:
    """Serve the status socket at ``path`` (0600).  A missing parent directory is
    created 0700; an existing one is left as it is (``--socket /tmp/x.sock`` must not
    make /tmp root-only).  What is at ``path`` already is replaced only when it is a
    socket nobody answers on (a crashed daemon's): anything else -- a regular file, a
    directory, a symlink -- is refused with RuntimeError, never deleted."""
    p = Path(path)
    if not p.parent.is_dir():
        try:
            p.parent.mkdir(mode=0o700, parents=True)
        except FileExistsError:  # created meanwhile (or a non-directory): the bind says
            pass
        else:
            os.chmod(p.parent, 0o700)  # mkdir's mode is cut by the umask
    problem = socket_path_problem(path)
    if problem is not None:
        raise RuntimeError(problem)
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


_KINDS = {
    stat.S_IFREG: "a regular file",
    stat.S_IFDIR: "a directory",
    stat.S_IFLNK: "a symbolic link",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def socket_path_problem(path: str) -> str | None:
    """Why netlimitd will not take ``path`` for its status socket (something other
    than a socket is there), or None.  Checked before any kernel work."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"--socket {path}: {exc.strerror or exc}"
    if stat.S_ISSOCK(st.st_mode):
        return None
    kind = _KINDS.get(stat.S_IFMT(st.st_mode), "something that is not a socket")
    return (
        f"--socket {path}: {kind} is there, not a socket; netlimitd replaces only a stale socket "
        "of its own and deletes nothing else: remove it, or pass another --socket path"
    )


def remove_status_socket(path: str) -> None:
    """Remove the status socket at shutdown -- only if a socket is still what is there."""
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except OSError:
        pass
