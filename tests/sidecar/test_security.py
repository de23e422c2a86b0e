"""The front door under attack: each hole issue 22 found, tried again with raw
sockets against a real sidecar in proxy mode and a recording upstream (the
application), next to a real nginx 1.22 given the same bytes where nginx is the
reference for what to answer."""

from __future__ import annotations

import json
import re
import socket
import time

import pytest
from logging_upstream import LoggingUpstream
from sidecar_proc import Nginx, Sidecar, get_metrics, metric, request, write_config

pytestmark = [pytest.mark.nginx, pytest.mark.timeout(120)]

CONFIG = """\
version: 1
http:
  domain: web
  trusted_proxies: [127.0.0.2/32]
  actions:
    - [remote_address]
    - [path, remote_address]
  descriptors:
    - key: remote_address
      rate_limit: {unit: second, requests_per_unit: 1000000, name: everyone}
    - key: path
      value: /login
      descriptors:
        - key: remote_address
          rate_limit: {unit: minute, requests_per_unit: 5, name: login}
"""


@pytest.fixture(scope="module")
def app():
    u = LoggingUpstream()
    try:
        yield u
    finally:
        u.stop()


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, app):
    cfg = write_config(tmp_path_factory.mktemp("sec") / "n.yaml", CONFIG)
    sc = Sidecar(cfg, "--upstream", app.url, "--header-timeout", "2", "--max-connections", "64")
    try:
        yield sc
    finally:
        sc.stop()


@pytest.fixture(scope="module")
def nginx(app):
    ng = Nginx(
        f"""
        location / {{
            proxy_pass http://127.0.0.1:{app.port};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
        """,
        app.port,
    )
    try:
        yield ng
    finally:
        ng.stop()


def exchange(port: int, raw: bytes, *, wait: float = 3.0, src: str = "127.0.0.1") -> bytes:
    """Send raw bytes, read until the server closes or stays quiet for a moment."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait, source_address=(src, 0)) as s:
        s.sendall(raw)
        try:
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        out = b""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                data = s.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not data:
                break
            out += data
        return out


def statuses(raw: bytes) -> list[int]:
    return [int(m) for m in re.findall(rb"HTTP/1\.[01] (\d{3}) ", raw)]


def settle(app: LoggingUpstream, before: int, timeout: float = 2.0) -> list:
    """What the application received since ``before`` (waiting for in-flight ones)."""
    deadline = time.monotonic() + timeout
    n = app.count()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        if app.count() == n and time.monotonic() > deadline - timeout + 0.3:
            break
        n = app.count()
    with app.lock:
        return list(app.requests[before:])


def hits(sc: Sidecar) -> float:
    m = get_metrics(sc.admin_port, "/metrics")
    return metric(m, "netlimit_http_rule_hits_total", domain="web", rule="everyone")


# --- 1. smuggling through Connection: Content-Length ------------------------------------------


def test_connection_naming_content_length_cannot_smuggle_requests(proxy, app):
    """The body travels with its own length; the upstream sees one POST, never the
    GET /login requests hidden in its body, and a later client never gets their answers."""
    smuggled = b"GET /login HTTP/1.1\r\nHost: a\r\n\r\n" * 10
    raw = (
        b"POST /form HTTP/1.1\r\nHost: a\r\nConnection: Content-Length\r\nContent-Length: %d\r\n\r\n" % len(smuggled)
        + smuggled
    )
    before, counted = app.count(), hits(proxy)
    out = exchange(proxy.port, raw)
    assert statuses(out) == [200]
    got = settle(app, before)
    assert [(m, t) for m, t, _ in got] == [("POST", "/form")]
    assert got[0][2] == smuggled
    assert hits(proxy) - counted == 1
    # the next client on the pooled upstream connection gets its own answer
    r = request(proxy.port, "GET", "/after")
    assert r.status == 200 and settle(app, before)[-1][:2] == ("GET", "/after")


# --- 2. SSRF through CONNECT and odd targets -------------------------------------------------


@pytest.mark.parametrize(
    "line,status",
    [
        (b"CONNECT @127.0.0.1:%d HTTP/1.1", 405),
        (b"CONNECT 127.0.0.1:%d HTTP/1.1", 405),
        (b"GET @127.0.0.1:%d/x HTTP/1.1", 400),
        (b"OPTIONS * HTTP/1.1", 400),
    ],
)
def test_connect_and_other_target_forms_never_reach_another_host(proxy, app, line, status):
    internal = socket.create_server(("127.0.0.1", 0))
    internal.settimeout(0.5)
    try:
        port = internal.getsockname()[1]
        before = app.count()
        raw = (line % port if b"%d" in line else line) + b"\r\nHost: a\r\n\r\n"
        assert statuses(exchange(proxy.port, raw)) == [status]
        with pytest.raises(TimeoutError):
            internal.accept()  # nothing connected to the internal service
        assert settle(app, before, 0.5) == []
    finally:
        internal.close()


def test_absolute_form_is_taken_by_its_path(proxy, app):
    before = app.count()
    out = exchange(proxy.port, b"GET http://evil.example/x?y=1 HTTP/1.1\r\nHost: a\r\n\r\n")
    assert statuses(out) == [200]
    assert [(m, t) for m, t, _ in settle(app, before)] == [("GET", "/x?y=1")]


# --- 3. X-Forwarded-For over two field lines ------------------------------------------------------


def test_x_forwarded_for_over_two_field_lines_is_one_list(proxy, app):
    """From a trusted proxy (127.0.0.2), the client is the right-most address that is
    not a trusted proxy, over every X-Forwarded-For line (HAProxy's option forwardfor)."""
    raw = b"GET /login HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 203.0.113.50\r\nX-Forwarded-For: 198.51.100.9\r\n\r\n"
    codes = [statuses(exchange(proxy.port, raw, src="127.0.0.2"))[0] for _ in range(10)]
    assert codes == [200] * 5 + [429] * 5
    # the client 198.51.100.9 is limited; 203.0.113.50 (what a first-line reader picks) is not
    other = b"GET /login HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 198.51.100.10\r\n\r\n"
    assert statuses(exchange(proxy.port, other, src="127.0.0.2")) == [200]


# --- 4. invalid requests: 400, as nginx --------------------------------------------------------------


INVALID = {
    "tab-after-target": b"GET /login\t HTTP/1.1\r\nHost: a\r\n\r\n",
    "vt-after-target": b"GET /login\x0b HTTP/1.1\r\nHost: a\r\n\r\n",
    "ff-after-target": b"GET /login\x0c HTTP/1.1\r\nHost: a\r\n\r\n",
    "x1c-after-target": b"GET /login\x1c HTTP/1.1\r\nHost: a\r\n\r\n",
    "nul-in-target": b"GET /lo\x00gin HTTP/1.1\r\nHost: a\r\n\r\n",
    "control-in-method": b"G\x01ET /login HTTP/1.1\r\nHost: a\r\n\r\n",
    "nul-in-value": b"GET /login HTTP/1.1\r\nHost: a\r\nX-A: a\x00b\r\n\r\n",
    "no-host": b"GET /login HTTP/1.1\r\n\r\n",
    "two-hosts": b"GET /login HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    "superscript-length": b"POST /login HTTP/1.1\r\nHost: a\r\nContent-Length: \xc2\xb2\r\n\r\nab",
    "5000-digit-length": b"POST /login HTTP/1.1\r\nHost: a\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n",
    "http10-chunked": b"POST /login HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "bare-cr": b"GET /login HTTP/1.1\r\nHost: a\rX-A: b\r\n\r\n",
    "cl-and-te": b"POST /login HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
}


@pytest.mark.parametrize("name", sorted(INVALID))
def test_invalid_requests_are_400_like_nginx_and_never_forwarded(proxy, nginx, app, name):
    raw = INVALID[name]
    before = app.count()
    ours = statuses(exchange(proxy.port, raw))
    assert ours == [400], (name, ours)
    assert settle(app, before, 0.3) == []
    assert statuses(exchange(nginx.port, raw)) == [400], f"nginx answers {name} differently"
    assert settle(app, before, 0.3) == []


@pytest.mark.parametrize("size", [70_000, 200_000])
def test_an_oversized_head_is_431_and_never_forwarded_even_in_one_read(proxy, app, size):
    before = app.count()
    raw = b"GET /big HTTP/1.1\r\nHost: a\r\nX-Big: " + b"a" * size + b"\r\n\r\n"
    assert statuses(exchange(proxy.port, raw)) == [431]
    assert settle(app, before, 0.3) == []


# what nginx answers for versions and protocols llhttp accepts (or refuses) differently
VERSIONS = {
    "http-2.0": (b"GET /login HTTP/2.0\r\nHost: a\r\n\r\n", 505),
    "http-3.0": (b"GET /login HTTP/3.0\r\nHost: a\r\n\r\n", 505),
    "http-2.1": (b"GET /login HTTP/2.1\r\nHost: a\r\n\r\n", 505),
    "http-0.9": (b"GET /login HTTP/0.9\r\nHost: a\r\n\r\n", 400),
    "rtsp-1.0": (b"GET /login RTSP/1.0\r\nHost: a\r\n\r\n", 400),
    "rtsp-1.0-describe": (b"DESCRIBE /login RTSP/1.0\r\nHost: a\r\n\r\n", 400),
    "ice-1.0": (b"SOURCE /login ICE/1.0\r\nHost: a\r\n\r\n", 400),
}


@pytest.mark.parametrize("name", sorted(VERSIONS))
def test_other_versions_and_protocols_are_answered_like_nginx(proxy, nginx, app, name):
    """llhttp takes HTTP/2.0 and 0.9 (and RTSP/1.0, ICE/1.0 as HTTP/1.0); nginx
    answers 505 for a version it cannot speak and 400 for the rest: so do we,
    and neither forwards anything."""
    raw, status = VERSIONS[name]
    before = app.count()
    assert statuses(exchange(nginx.port, raw)) == [status], f"nginx answers {name} differently"
    assert settle(app, before, 0.3) == []
    assert statuses(exchange(proxy.port, raw)) == [status], name
    assert settle(app, before, 0.3) == []


def test_an_rtsp_request_line_arriving_a_byte_at_a_time_is_refused(proxy, app):
    before = app.count()
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as s:
        for b in b"GET /login RTSP/1.0\r\nHost: a\r\n\r\n":
            s.sendall(bytes([b]))
            time.sleep(0.002)
        out = b""
        while b"\r\n\r\n" not in out:
            data = s.recv(4096)
            if not data:
                break
            out += data
    assert statuses(out) == [400]
    assert settle(app, before, 0.3) == []


@pytest.mark.parametrize("value", ["%C2%B2", "\u00b2", "9" * 5000, "0429", "-429", "+429", "4\u0662\u0669", "4%D9%A2"])
def test_a_bad_deny_status_is_a_clean_400(proxy, value):
    """deny_status=² (isdigit() is true, int() raises) and a 5000-digit value: a 400
    naming the parameter (raw non-ASCII bytes in the target are refused by llhttp
    before: a 400 that closes the connection), the log without a traceback."""
    mark = proxy.mark()
    target = "/v1/check?deny_status=" + value
    raw = f"GET {target} HTTP/1.1\r\nHost: a\r\nX-Original-URI: /\r\n\r\nGET /healthz HTTP/1.1\r\nHost: a\r\n\r\n"
    out = exchange(proxy.admin_port, raw.encode("utf-8"))
    if value.isascii():
        assert statuses(out) == [400, 200], out[:400]
        assert b"deny_status must be a 4xx status code" in out
    else:
        assert statuses(out) == [400] and b"malformed request" in out, out[:400]
    assert "Traceback" not in "\n".join(proxy.log().splitlines()[mark:])


def test_bad_input_is_counted_and_logged_without_tracebacks_and_boundedly(proxy):
    mark = proxy.mark()
    m0 = get_metrics(proxy.admin_port, "/metrics")
    for _ in range(200):
        exchange(proxy.port, INVALID["tab-after-target"], wait=1)
    m1 = get_metrics(proxy.admin_port, "/metrics")
    key = {"endpoint": "proxy", "result": "bad_request"}
    assert metric(m1, "netlimit_http_requests_total", **key) - metric(m0, "netlimit_http_requests_total", **key) == 200
    lines = proxy.log().splitlines()[mark:]
    assert "Traceback" not in "\n".join(lines)
    assert sum("refused with 400" in line for line in lines) <= 2  # at most one per 10 s


# --- 6. slowloris and the connection cap ----------------------------------------------------------------


def test_a_head_that_trickles_in_is_cut_at_the_header_timeout(proxy):
    """One byte every 0.2 s keeps the idle timer of a naive server alive forever; the
    whole head must arrive within --header-timeout (2 s here)."""
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        closed = False
        got = b""
        for ch in b"GET /slow HTTP/1.1\r\nHost: a\r\nX-Pad: " + b"a" * 200:
            try:
                s.sendall(bytes([ch]))
            except OSError:
                closed = True
                break
            s.settimeout(0.2)
            try:
                data = s.recv(4096)
                got += data
                if not data or b"\r\n\r\n" in got:
                    closed = True
                    break
            except TimeoutError:
                pass
            if time.monotonic() - t0 > 8:
                break
    assert closed, "the trickling client was never cut off"
    assert 1.5 <= time.monotonic() - t0 < 5
    assert statuses(got) in ([408], [])


def test_at_the_connection_cap_the_oldest_idle_connection_makes_room(proxy):
    idle = []
    try:
        for _ in range(70):  # more than --max-connections 64, all idle
            idle.append(socket.create_connection(("127.0.0.1", proxy.port), timeout=5))
        r = request(proxy.port, "GET", "/new")  # a new client is still served
        assert r.status == 200
        h = proxy.admin("/healthz").json()
        assert h["connections"] <= 64 and h["connections_shed"] >= 6
    finally:
        for s in idle:
            s.close()


# --- 7/8. pipelining without reading, and deep pipelines ------------------------------------------


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith("VmRSS:")))


def test_a_client_that_pipelines_and_never_reads_cannot_grow_memory(proxy):
    req = b"GET /p HTTP/1.1\r\nHost: a\r\n\r\n"
    rss0 = _rss_kib(proxy.proc.pid)
    sent = 0
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as s:
        s.setblocking(False)
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline and sent < 200 * 1024 * 1024:
            try:
                sent += s.send(req * 2000)
            except BlockingIOError:
                time.sleep(0.05)  # the sidecar stopped reading us: the kernel buffers are full
        grown = _rss_kib(proxy.proc.pid) - rss0
    assert sent < 200 * 1024 * 1024, "the sidecar read everything a client that never reads sent"
    assert grown < 64 * 1024, f"RSS grew by {grown} KiB"


def test_hundreds_of_pipelined_429s_are_answered_in_order(proxy, app):
    n = 1500
    raw = b"GET /login HTTP/1.1\r\nHost: a\r\n\r\n" * n + b"GET /end HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
    out = exchange(proxy.port, raw, wait=20, src="127.0.0.3")
    codes = statuses(out)
    assert len(codes) == n + 1 and codes[:5] == [200] * 5 and set(codes[5:n]) == {429} and codes[-1] == 200


# --- 10. slow uploads do not pin upstream connections ---------------------------------------------------


def test_slow_uploads_are_buffered_before_an_upstream_connection_is_used(proxy, app):
    accepts = app.accepts
    clients = []
    try:
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
            s.sendall(b"POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
            clients.append(s)
        time.sleep(0.5)
        assert app.accepts == accepts  # nothing reached the application yet
        for s in clients:
            s.sendall(b"x" * 90)
        for s in clients:
            assert s.recv(4096).startswith(b"HTTP/1.1 200")
        assert app.accepts - accepts <= 20
    finally:
        for s in clients:
            s.close()


# --- 11. a bad Redis URL is a config error ---------------------------------------------------------------


@pytest.mark.parametrize("url", ["redis://127.0.0.1:99999/0", "redis://127.0.0.1:abc/0", "redis://[::1/0"])
def test_a_bad_redis_url_is_a_config_error_with_its_line(tmp_path, url):
    import subprocess

    from sidecar_proc import netlimit_cmd

    cfg = write_config(tmp_path / "r.yaml", CONFIG.replace("  domain: web\n", f"  domain: web\n  storage: {url!r}\n"))
    p = subprocess.run([*netlimit_cmd(), "sidecar", "--config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    assert f"{cfg}:4:12: http:" in p.stderr and "storage" in p.stderr and "Traceback" not in p.stderr
    p = subprocess.run(
        [*netlimit_cmd(), "sidecar", "--config", str(cfg).replace("r.yaml", "x.yaml"), "--redis", url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode != 0 and "Traceback" not in p.stderr


def test_the_admin_endpoints_are_not_reachable_through_the_proxy(proxy, app):
    before = app.count()
    for path in ("/_netlimit/v1/check", "/v1/check", "/metrics"):
        body = json.dumps({"domain": "web", "descriptors": [{"entries": [{"key": "remote_address",
                                                                           "value": "198.51.100.77"}]}]})  # fmt: skip
        raw = (
            f"POST {path} HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            f"{body}"
        ).encode()
        assert statuses(exchange(proxy.port, raw)) == [200]  # the application's answer, not a decision
    assert len(settle(app, before)) == 3
