"""The client side of netlimitd's status socket: ask a running daemon for its
status, find one, ask it to reload, stand down or resume.

A shared helper (not part of the daemon package) because the kernel layer's
commands (`apply`, `flush`) must find a running netlimitd too, and the daemon
imports the kernel layer, never the other way (docs/architecture.md).
"""

from __future__ import annotations

import json
import socket
from typing import Any

DEFAULT_SOCKET = "/run/netlimit/netlimitd.sock"


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


def find_daemon(path: str = DEFAULT_SOCKET, timeout: float = 5.0) -> dict[str, Any] | None:
    """The status of the netlimitd answering on ``path``; None when none does
    (no socket, a stale one, no right to connect, an answer that is no status)."""
    try:
        st = query_status(path, timeout)
    except (OSError, ValueError):
        return None
    return st if isinstance(st, dict) and "pid" in st else None


def control(path: str, action: str, timeout: float = 90.0, **fields: Any) -> dict[str, Any]:
    """Ask the daemon on ``path`` to reload, stand down or resume; its answer
    ({"ok": bool, "summary": ..., "error": ...}). Raises OSError when none answers."""
    req = json.dumps({"control": action, **fields}).encode() + b"\n"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall(req)
        buf = b""
        while not buf.endswith(b"\n") and len(buf) < (1 << 20):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    try:
        out = json.loads(buf.decode())
    except ValueError:
        return {"ok": False, "error": f"no answer from netlimitd on {path}"}
    return out if isinstance(out, dict) else {"ok": False, "error": "an answer that is not a JSON object"}
