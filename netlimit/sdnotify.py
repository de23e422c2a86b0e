"""systemd's notification protocol (sd_notify(3)) without libsystemd.

Messages go as one datagram to $NOTIFY_SOCKET (a path, or '@name' for the
abstract namespace). Outside systemd (no NOTIFY_SOCKET) every call is a no-op.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping


class Notifier:
    def __init__(self, env: Mapping[str, str] | None = None):
        if env is None:
            env = os.environ
        addr = env.get("NOTIFY_SOCKET", "")
        self.address: str | None = None
        if addr.startswith("@"):
            self.address = "\0" + addr[1:]
        elif addr.startswith("/"):
            self.address = addr
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        self.watchdog_usec = int(usec) if usec.isdigit() and (not pid or pid == str(os.getpid())) else 0
        self._sock: socket.socket | None = None

    def notify(self, *fields: str) -> bool:
        if self.address is None:
            return False
        if self._sock is None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        msg = "\n".join(f.replace("\n", " ") for f in fields).encode()
        try:
            self._sock.sendto(msg, self.address)
            return True
        except OSError:
            return False

    def ready(self, status: str) -> bool:
        return self.notify("READY=1", f"STATUS={status}")

    def reloading(self) -> bool:
        import time

        return self.notify("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")

    def status(self, status: str) -> bool:
        return self.notify(f"STATUS={status}")

    def stopping(self) -> bool:
        return self.notify("STOPPING=1")

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
