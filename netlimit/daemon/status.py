"""The daemon's state as `netlimit status` sees it: the Status record the main
loop publishes, the status socket (a root-only Unix socket, one JSON document
per connection) and its client."""

from __future__ import annotations

import json
import os
import socket
import socketserver
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

DEFAULT_SOCKET = "/run/netlimit/netlimitd.sock"
#: the longest request line a client may send, and the most time it may take
MAX_REQUEST = 4096  # a ban request (JSON, netlimit.bans.socket_client) is the longest
CLIENT_TIMEOUT = 5.0


class StatusSource(Protocol):
    def status_payload(self) -> dict[str, Any]: ...
    def ban_request(self, req: dict[str, Any]) -> dict[str, Any]: ...


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
    held: str | None = None  # a valid file held back because it would remove every rule
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
        elif self.held:
            s += f"; new config held: {self.held}"
        if self.drift_repairs:
            s += f"; {self.drift_repairs} drift repairs"
        return s


class _StatusHandler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        daemon: StatusSource = self.server.daemon_ref  # type: ignore[attr-defined]
        self.connection.settimeout(CLIENT_TIMEOUT)  # a client that never sends its line cannot hold a thread
        try:
            line = self.rfile.readline(MAX_REQUEST)
            req = _ban_request(line)
            payload = daemon.ban_request(req) if req is not None else daemon.status_payload()
            self.wfile.write((json.dumps(payload) + "\n").encode())
        except Exception as exc:  # never let a client take the daemon down
            try:
                self.wfile.write((json.dumps({"error": str(exc)}) + "\n").encode())
            except OSError:
                pass


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


def open_status_socket(path: str, daemon: StatusSource) -> _StatusServer:
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
