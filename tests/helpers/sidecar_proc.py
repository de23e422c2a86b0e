"""Real processes for the sidecar tests: the sidecar itself (`netlimit sidecar`),
a tiny upstream app, nginx; plus a plain HTTP client.

Everything listens on 127.0.0.1; every process is killed in a finally (the
fixtures) or by the caller's context manager; every wait is bounded.
Import explicitly: ``from sidecar_proc import ...``.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
SNIPPET = REPO / "rules" / "nginx-auth-request.conf"


def netlimit_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "netlimit"
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-m", "netlimit.cli"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def logged_at(m: re.Match) -> float:
    """When a netlimit process logged the line a ``wait_line`` match is in: its leading
    ``%(asctime)s`` (netlimit/logs.py's text format; local time, to the millisecond),
    or in ``--log-format json`` its ``time`` field (ISO 8601 with the offset)."""
    if m.string.startswith("{"):
        from datetime import datetime

        return datetime.fromisoformat(json.loads(m.string)["time"]).timestamp()
    stamp = m.string[:23]
    return time.mktime(time.strptime(stamp[:19], "%Y-%m-%d %H:%M:%S")) + int(stamp[20:23]) / 1000


def write_config(path: Path, text: str) -> Path:
    """Replace the file atomically (write + rename, as editors do)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(textwrap.dedent(text))
    os.replace(tmp, path)
    return path


# --- HTTP client ---------------------------------------------------------------------


@dataclass
class Resp:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        vals = self.all(name)
        return vals[0] if vals else None

    def all(self, name: str) -> list[str]:
        n = name.lower()
        return [v for k, v in self.headers if k.lower() == n]

    def names(self) -> set[str]:
        return {k.lower() for k, _ in self.headers}

    def json(self):
        return json.loads(self.body)


def request(
    port: int,
    method: str,
    path: str,
    headers: dict[str, str] | list[tuple[str, str]] | None = None,
    body: bytes | None = None,
    timeout: float = 10.0,
) -> Resp:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        items = list(headers.items() if isinstance(headers, dict) else (headers or []))
        conn.putrequest(method, path, skip_accept_encoding=True, skip_host=any(k.lower() == "host" for k, _ in items))
        for k, v in items:
            conn.putheader(k, v)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        r = conn.getresponse()
        data = r.read()
        return Resp(r.status, list(r.getheaders()), data)
    finally:
        conn.close()


def get_metrics(port: int, path: str = "/metrics") -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Scrape and parse Prometheus text: {(sample name, sorted labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    r = request(port, "GET", path)
    assert r.status == 200, r
    assert r.header("Content-Type").startswith("text/plain; version=0.0.4")
    out = {}
    for fam in text_string_to_metric_families(r.body.decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def metric(samples, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


# --- processes --------------------------------------------------------------------


class LogProc:
    """A child process whose stderr (or stdout) lines are collected by a thread."""

    def __init__(self, argv: list[str], *, stream: str = "stderr", env: dict | None = None, cwd=None):
        self.argv = argv
        kw = (
            {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT}
            if stream == "stdout"
            else {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE}
        )
        self.proc = subprocess.Popen(argv, env=env, cwd=cwd, text=True, bufsize=1, **kw)
        self.lines: list[str] = []
        self._cv = threading.Condition()
        src = self.proc.stdout if stream == "stdout" else self.proc.stderr
        self._t = threading.Thread(target=self._drain, args=(src,), daemon=True)
        self._t.start()

    def _drain(self, f) -> None:
        for line in f:
            with self._cv:
                self.lines.append(line.rstrip("\n"))
                self._cv.notify_all()
        with self._cv:
            self._cv.notify_all()

    def log(self) -> str:
        with self._cv:
            return "\n".join(self.lines)

    def wait_line(self, pattern: str, timeout: float = 10.0, start: int = 0) -> re.Match:
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                for line in self.lines[start:]:
                    m = rx.search(line)
                    if m:
                        return m
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._t.is_alive()):
                    break
                self._cv.wait(min(left, 0.2))
        raise AssertionError(
            f"no line matching {pattern!r} within {timeout}s from {self.argv[:3]} "
            f"(exit code {self.proc.poll()}); output:\n{self.log()[-4000:]}"
        )

    def mark(self) -> int:
        with self._cv:
            return len(self.lines)

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, timeout: float = 5.0) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self._t.join(timeout=2)
        return self.proc.returncode


class Sidecar(LogProc):
    """`netlimit sidecar --config FILE --listen 127.0.0.1:0 ...`; the ports are read
    from its "listening on" / "admin listener on" log lines (no free-port race).
    In proxy mode the admin listener (decision and operator endpoints) gets a port
    of its own (``admin_port``); in decision mode it is the listener itself."""

    def __init__(self, config: Path, *extra: str):
        args = list(extra)
        if "--upstream" in args and "--admin-listen" not in args:
            args += ["--admin-listen", "127.0.0.1:0"]
        super().__init__([*netlimit_cmd(), "sidecar", "--config", str(config), "--listen", "127.0.0.1:0", *args])
        try:
            m = self.wait_line(r"listening on http://127\.0\.0\.1:(\d+)", timeout=15)
            self.port = int(m.group(1))
            self.admin_port = self.port
            if "--admin-listen" in args:
                self.admin_port = int(self.wait_line(r"admin listener on http://[^:]+:(\d+)", timeout=15).group(1))
        except BaseException:
            self.stop()
            raise
        self.config = config

    def get(self, path: str, headers=None) -> Resp:
        return request(self.port, "GET", path, headers)

    def admin(self, path: str, headers=None) -> Resp:
        return request(self.admin_port, "GET", path, headers)

    def post_json(self, path: str, obj, headers=None, *, admin: bool = False) -> Resp:
        body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        h = {"Content-Type": "application/json", **(headers or {})}
        return request(self.admin_port if admin else self.port, "POST", path, h, body)


class Upstream(LogProc):
    def __init__(self):
        super().__init__([sys.executable, str(HERE / "upstream_app.py")], stream="stdout")
        try:
            self.port = int(self.wait_line(r"^PORT (\d+)", timeout=15).group(1))
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def count(self) -> int:
        return request(self.port, "GET", "/count").json()["n"]


NGINX = (
    os.environ.get("NETLIMIT_NGINX")
    or shutil.which("nginx")
    or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
)


class Nginx(LogProc):
    """nginx in the foreground (daemon off, master_process off) with a temp prefix."""

    def __init__(self, server_body: str, sidecar_port: int, *, http_extra: str = ""):
        """``http_extra``: directives for the http block (limit_req_zone ...)."""
        if NGINX is None:
            pytest.fail(
                "nginx is not installed (looked in PATH and /usr/sbin/nginx): the nginx tests need a "
                "real nginx: `apt-get install nginx-light` or set NETLIMIT_NGINX",
                pytrace=False,
            )
        self.dir = Path(tempfile.mkdtemp(prefix="netlimit-nginx-"))
        (self.dir / "logs").mkdir()
        (self.dir / "tmp").mkdir()
        self.port = free_port()
        d = self.dir
        conf = f"""
daemon off;
master_process off;
worker_processes 1;
error_log {d}/logs/error.log info;
pid {d}/nginx.pid;
events {{ worker_connections 512; }}
http {{
    access_log off;
    client_body_temp_path {d}/tmp/body;
    proxy_temp_path {d}/tmp/proxy;
    fastcgi_temp_path {d}/tmp/fastcgi;
    uwsgi_temp_path {d}/tmp/uwsgi;
    scgi_temp_path {d}/tmp/scgi;
    upstream netlimit_sidecar {{
        server 127.0.0.1:{sidecar_port};
        keepalive 16;
    }}
    {http_extra}
    server {{
        listen 127.0.0.1:{self.port};
{textwrap.indent(textwrap.dedent(server_body), "        ")}
    }}
}}
"""
        (d / "nginx.conf").write_text(conf)
        check = subprocess.run(
            [NGINX, "-t", "-p", str(d), "-c", str(d / "nginx.conf")], capture_output=True, text=True, timeout=20
        )
        if check.returncode != 0:
            shutil.rmtree(d, ignore_errors=True)
            raise AssertionError(f"nginx -t rejected the config:\n{check.stderr}\n{conf}")
        super().__init__([NGINX, "-p", str(d), "-c", str(d / "nginx.conf")])
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    err = self.error_log()
                    self.stop()
                    raise AssertionError(f"nginx did not start: {self.log()}\n{err}") from None
                time.sleep(0.02)

    def error_log(self) -> str:
        try:
            return (self.dir / "logs" / "error.log").read_text()[-4000:]
        except OSError:
            return ""

    def stop(self, timeout: float = 5.0) -> int | None:
        try:
            return super().stop(timeout)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def wait_until(pred, timeout: float, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s")
        time.sleep(interval)
