"""A REAL redis-server child process on loopback (the root conftest makes one per
session, and throw-away ones for tests that stop or kill the server).

No mocks and no skips: if redis-server is missing the tests fail and say how to
install it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REDIS_SERVER = (
    os.environ.get("NETLIMIT_REDIS_SERVER")
    or shutil.which("redis-server")
    or ("/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None)
)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RedisServer:
    """A redis-server child process on a loopback port in its own temp dir."""

    port: int
    dir: Path
    proc: subprocess.Popen | None = None
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.dir / "redis.log"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> RedisServer:
        assert REDIS_SERVER is not None
        self.proc = subprocess.Popen(
            [
                REDIS_SERVER,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.dir),
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "no",
                "--logfile",
                str(self.log),
                "--daemonize",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: {self._log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                pass
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server on port {self.port} did not answer PING: {self._log_tail()}")

    def pause(self) -> None:
        """SIGSTOP: the server keeps its socket open but answers nothing (a "slow" Redis)."""
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def stop(self) -> None:
        """Kill the server (SIGCONT first in case it is paused) and reap it."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.kill(self.proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        self.proc.kill()
        self.proc.wait(timeout=10)

    def _log_tail(self) -> str:
        try:
            return self.log.read_text()[-2000:]
        except OSError:
            return "(no log)"


def _require_redis_server() -> str:
    if REDIS_SERVER is None:
        pytest.fail(
            "redis-server is not installed (looked in PATH and /usr/bin). The Redis store tests need a "
            "real server: `apt-get install redis-server` (Debian/Ubuntu) or set NETLIMIT_REDIS_SERVER "
            "to its path.",
            pytrace=False,
        )
    return REDIS_SERVER
