"""One redis-server (or sentinel) child process driven by a config file it owns:
the building block of the cluster and sentinel set-ups (redis_cluster.py,
redis_sentinel.py).  Loopback only, free ports, bounded waits; ``stop`` kills
and reaps (SIGCONT first, in case a test paused it).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis_proc import _free_port, _require_redis_server
from tls_certs import TlsFiles


def free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports (held together while chosen, so no two are the same)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class Auth:
    """The default user's password (admin, replication) and an ACL user for netlimit."""

    admin_password: str = "admin-pw"
    user: str = "netlimit"
    password: str = "s3cret"
    # what netlimit needs: its scripts (and the commands they call), the cluster map,
    # ASKING, INFO / ROLE (detection, sentinel checks)
    rules: str = (
        "~netlimit:* resetchannels -@all +@read +@write +@scripting +@connection +time +asking +info +role "
        "+cluster|shards +cluster|slots +cluster|info"
    )


@dataclass
class RedisNode:
    """A redis-server with ``options`` (config lines) on 127.0.0.1:``port``."""

    dir: Path
    options: list[str] = field(default_factory=list)
    port: int = field(default_factory=_free_port)
    tls: TlsFiles | None = None
    auth: Auth | None = None
    sentinel: bool = False
    tls_auth_clients: str = "optional"  # "yes": clients must present a certificate
    proc: subprocess.Popen | None = None

    @property
    def log(self) -> Path:
        return self.dir / ("sentinel.log" if self.sentinel else "redis.log")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def config(self) -> str:
        lines = [
            "bind 127.0.0.1",
            "protected-mode no",
            f"dir {self.dir}",
            f"logfile {self.log}",
            "daemonize no",
        ]
        if not self.sentinel:
            lines += ['save ""', "appendonly no"]
        if self.tls is not None:
            t = self.tls
            lines += [
                "port 0",
                f"tls-port {self.port}",
                f"tls-cert-file {t.server_cert}",
                f"tls-key-file {t.server_key}",
                f"tls-ca-cert-file {t.ca}",
                f"tls-auth-clients {self.tls_auth_clients}",
                "tls-replication yes",
            ]
        else:
            lines.append(f"port {self.port}")
        if self.auth is not None and not self.sentinel:
            a = self.auth
            lines += [
                f"requirepass {a.admin_password}",
                f"masterauth {a.admin_password}",
                f"user {a.user} on >{a.password} {a.rules}",
            ]
        return "\n".join(lines + self.options) + "\n"

    def start(self, wait: bool = True) -> RedisNode:
        exe = _require_redis_server()
        self.dir.mkdir(parents=True, exist_ok=True)
        conf = self.dir / ("sentinel.conf" if self.sentinel else "redis.conf")
        conf.write_text(self.config())
        args = [exe, str(conf)] + (["--sentinel"] if self.sentinel else [])
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        if wait:
            self.wait_ping()
        return self

    def client(self, **kw: Any) -> redis.Redis:
        """A redis-py client as an administrator (the default user)."""
        opts: dict[str, Any] = {
            "host": "127.0.0.1",
            "port": self.port,
            "socket_timeout": 5,
            "socket_connect_timeout": 2,
        }
        if self.auth is not None and not self.sentinel:
            opts["password"] = self.auth.admin_password
        if self.tls is not None:
            opts.update(
                ssl=True,
                ssl_ca_certs=str(self.tls.ca),
                ssl_certfile=str(self.tls.client_cert),
                ssl_keyfile=str(self.tls.client_key),
            )
        opts.update(kw)
        return redis.Redis(**opts)

    def call(self, *args: Any) -> Any:
        c = self.client()
        try:
            return c.execute_command(*args)
        finally:
            c.close()

    def wait_ping(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"redis-server on {self.port} exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                if self.call("PING"):
                    return
            except (redis.RedisError, OSError) as e:
                last = e
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis on {self.port} did not answer PING in {timeout} s ({last}): {self.log_tail()}")

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.kill(self.proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        self.proc.kill()
        self.proc.wait(timeout=10)

    def log_tail(self) -> str:
        try:
            return self.log.read_text()[-2000:]
        except OSError:
            return "(no log)"


def wait_for(pred, timeout: float, what: str, interval: float = 0.05):
    """Poll ``pred`` until it returns something true (returned) or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        try:
            v = pred()
            if v:
                return v
        except (redis.RedisError, OSError) as e:
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s" + (f" (last error: {last})" if last else ""))
        time.sleep(interval)


async def await_for(pred, timeout: float, what: str, interval: float = 0.05):
    """:func:`wait_for` inside an event loop (the loop runs while it waits)."""
    import asyncio

    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        try:
            v = pred()
            if v:
                return v
        except (redis.RedisError, OSError) as e:
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s" + (f" (last error: {last})" if last else ""))
        await asyncio.sleep(interval)
