"""The proxy fast path (netlimit/sidecar/proxy.py) against a tiny scripted upstream
that runs in this process (real sockets on 127.0.0.1): connection reuse,
pipelining, streamed bodies both ways, response framings, upstream failures
(down, silent, hanging up, broken body, a pooled connection closed meanwhile),
header handling, and the hand-off to aiohttp for what the fast path leaves
alone.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import socket
import threading
import time

import pytest
from sidecar_proc import Sidecar, free_port, request, write_config

pytestmark = pytest.mark.timeout(60)

CONFIG = """\
version: 1
http:
  domain: web
  trusted_proxies: [127.0.0.1/32]
  actions:
    - [remote_address]
  descriptors:
    - key: remote_address
      value: 198.51.100.1
      rate_limit: {unit: hour, requests_per_unit: 1, name: one}
      algorithm: token_bucket
    - key: remote_address
      rate_limit: {unit: second, requests_per_unit: 100000, name: lots}
      algorithm: token_bucket
"""


class RawUpstream:
    """HTTP/1.1 by hand, one thread per connection; counts accepts and records
    every request (method, target, header list, body)."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepts = 0
        self.requests: list[tuple[str, str, list[tuple[str, str]], bytes]] = []
        self.lock = threading.Lock()
        self.stopped = False
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.stopped = True
        self.sock.close()
        for c in list(self.conns):
            try:
                c.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while not self.stopped:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.accepts += 1
                self.conns.append(c)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket) -> None:
        f = c.makefile("rb")
        n = 0
        try:
            while True:
                line = f.readline()
                if not line:
                    return
                method, target, _ = line.decode("latin-1").rstrip("\r\n").split(" ")
                headers = []
                while True:
                    h = f.readline().decode("latin-1").rstrip("\r\n")
                    if not h:
                        break
                    k, _, v = h.partition(":")
                    headers.append((k, v.strip()))
                cl = next((int(v) for k, v in headers if k.lower() == "content-length"), 0)
                path = target.split("?")[0]
                if path == "/early":  # answers before reading the body, then drains it
                    c.sendall(b"HTTP/1.1 413 Content Too Large\r\nContent-Length: 3\r\n\r\nbig")
                    c.shutdown(socket.SHUT_WR)
                    while f.read1(65536):
                        pass
                    return
                if path == "/upload":
                    hsh, size = hashlib.sha256(), 0
                    while size < cl:
                        chunk = f.read1(min(65536, cl - size))
                        if not chunk:
                            return
                        hsh.update(chunk)
                        size += len(chunk)
                    body = json.dumps({"size": size, "sha256": hsh.hexdigest()}).encode()
                    with self.lock:
                        self.requests.append((method, target, headers, b""))
                elif any(k.lower() == "transfer-encoding" for k, _ in headers):
                    body = b""
                    while True:
                        size = int(f.readline().split(b";")[0], 16)
                        if not size:
                            while f.readline().strip():
                                pass
                            break
                        body += f.read(size)
                        f.readline()
                    with self.lock:
                        self.requests.append((method, target, headers, body))
                else:
                    body = f.read(cl) if cl else b""
                    with self.lock:
                        self.requests.append((method, target, headers, body))
                n += 1
                if not self._answer(c, method, path, target, n, body):
                    return
        except (OSError, ValueError):
            return
        finally:
            try:
                c.close()
            except OSError:
                pass

    def _answer(self, c: socket.socket, method: str, path: str, target: str, n: int, body: bytes) -> bool:
        """Send the response; False closes the connection."""

        def send(*parts: bytes) -> None:
            for p in parts:
                c.sendall(p)

        if path == "/upload":
            send(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
            )
        elif path == "/chunked":
            send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n", b"5;ext=1\r\nhello\r\n")
            time.sleep(0.05)
            send(b"6\r\n wor", b"ld\r\n", b"0\r\nX-Sum: 11\r\n\r\n")
        elif path == "/close":  # body delimited by the connection's end
            send(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n", b"until ")
            time.sleep(0.05)
            send(b"the end")
            return False
        elif path == "/slow":
            time.sleep(3)
            send(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nslow")
        elif path == "/hangup":
            return False
        elif path == "/broken":
            send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b")
            time.sleep(0.1)
            return False
        elif path == "/garbage":
            send(b"SPDY/9 what\r\n\r\n")
            return False
        elif path == "/flaky" and n > 1:  # a reused connection the server had given up on
            return False
        elif path == "/interim":
            send(
                b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n"
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
            )
        elif path == "/hop":
            send(
                b"HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Secret\r\nX-Secret: s\r\nKeep-Alive: timeout=5\r\n"
                b"Proxy-Authenticate: Basic\r\nX-RateLimit-Limit: 7\r\nX-Kept: yes\r\nContent-Length: 3\r\n\r\nhop"
            )
        elif path == "/nocontent":
            send(b"HTTP/1.1 204 No Content\r\nX-N: 1\r\n\r\n")
        else:
            text = f"{method} {target} #{n}".encode()
            if method == "HEAD":
                send(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(text))
            else:
                send(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s" % (len(text), text))
        return True


@pytest.fixture(scope="module")
def upstream():
    up = RawUpstream()
    try:
        yield up
    finally:
        up.stop()


@pytest.fixture(scope="module")
def proxy(tmp_path_factory, upstream):
    cfg = write_config(tmp_path_factory.mktemp("fastproxy") / "netlimit.yaml", CONFIG)
    # a small request buffer: the streaming of uploads (and an upstream answering early) is tested too
    sc = Sidecar(cfg, "--upstream", upstream.url, "--upstream-timeout", "1", "--request-buffer", "1024")
    try:
        yield sc
    finally:
        sc.stop()


class _Keep:
    """A buffered reader whose close() keeps it open (http.client closes the
    file it reads a response from; pipelined responses share one)."""

    def __init__(self, f):
        self.f = f

    def __getattr__(self, name):
        return getattr(self.f, name)

    def close(self):
        pass


class _Sock:
    def __init__(self, f):
        self.f = _Keep(f)

    def makefile(self, *a, **k):
        return self.f


def read_response(f, method: str = "GET") -> tuple[int, list[tuple[str, str]], bytes, bool]:
    """One response from a shared buffered reader: status, headers, body, will_close."""
    r = http.client.HTTPResponse(_Sock(f), method=method)
    r.begin()
    return r.status, r.getheaders(), r.read(), r.will_close


def header(headers, name):
    vals = [v for k, v in headers if k.lower() == name.lower()]
    return vals[0] if vals else None


def test_one_upstream_connection_carries_many_requests(proxy, upstream):
    before = upstream.accepts
    for i in range(10):  # a new client connection each time
        r = request(proxy.port, "GET", f"/a?{i}")
        assert (r.status, r.body.split(b" #")[0]) == (200, f"GET /a?{i}".encode())
        assert r.header("X-RateLimit-Limit") == "100000"
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    try:  # one client connection, keep-alive
        for i in range(10):
            conn.request("GET", f"/b?{i}")
            resp = conn.getresponse()
            assert resp.read().startswith(f"GET /b?{i} #".encode())
    finally:
        conn.close()
    assert upstream.accepts - before <= 1


def test_pipelined_requests_are_answered_in_order(proxy):
    reqs = (
        b"GET /p1 HTTP/1.1\r\nHost: t\r\n\r\n"
        b"POST /p2 HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello"
        b"HEAD /p3 HTTP/1.1\r\nHost: t\r\n\r\n"
        b"GET /p4 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        s.sendall(reqs)
        f = s.makefile("rb")
        out = [read_response(f, m) for m in ("GET", "POST", "HEAD", "GET")]
        assert f.read() == b""  # closed after the last one
    assert [o[0] for o in out] == [200] * 4
    assert out[0][2].startswith(b"GET /p1 #")
    assert out[1][2].startswith(b"POST /p2 #")
    assert out[2][2] == b"" and header(out[2][1], "Content-Length") is not None
    assert out[3][2].startswith(b"GET /p4 #") and out[3][3]


def test_request_split_across_many_small_writes(proxy, upstream):
    msg = b"PUT /pieces HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n0123456789"
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(0, len(msg), 3):
            s.sendall(msg[i : i + 3])
            time.sleep(0.005)
        st, _, body, _ = read_response(s.makefile("rb"))
    assert (st, body.split(b" #")[0]) == (200, b"PUT /pieces")
    assert upstream.requests[-1][3] == b"0123456789"


def test_large_request_body_streams_with_its_length(proxy):
    data = bytes(range(256)) * (80 * 1024)  # 20 MiB: more than any buffer on the way
    r = request(proxy.port, "POST", "/upload", body=data, timeout=30)
    assert r.json() == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_chunked_response_passes_through_with_its_trailer(proxy):
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        s.sendall(b"GET /chunked HTTP/1.1\r\nHost: t\r\n\r\nGET /after HTTP/1.1\r\nHost: t\r\n\r\n")
        f = s.makefile("rb")
        st, hs, body, _ = read_response(f)
        assert (st, body, header(hs, "Transfer-Encoding")) == (200, b"hello world", "chunked")
        assert header(hs, "Trailer") is None  # hop-by-hop
        st, _, body, _ = read_response(f)  # the connection is still in step
        assert body.startswith(b"GET /after #")


def test_close_delimited_response_is_rechunked_and_the_client_connection_lives(proxy):
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        s.sendall(b"GET /close HTTP/1.1\r\nHost: t\r\n\r\n")
        f = s.makefile("rb")
        st, hs, body, closing = read_response(f)
        assert (st, body, header(hs, "Transfer-Encoding"), closing) == (200, b"until the end", "chunked", False)
        s.sendall(b"GET /again HTTP/1.1\r\nHost: t\r\n\r\n")
        assert read_response(f)[2].startswith(b"GET /again #")


def test_interim_responses_dropped_hop_by_hop_dropped_rate_headers_win(proxy):
    r = request(proxy.port, "GET", "/interim")
    assert (r.status, r.body) == (200, b"ok")
    r = request(proxy.port, "GET", "/hop")
    assert (r.status, r.body, r.header("X-Kept")) == (200, b"hop", "yes")
    assert not {"x-secret", "keep-alive", "proxy-authenticate"} & r.names()
    assert r.all("X-RateLimit-Limit") == ["100000"]  # the sidecar's, not the app's
    r = request(proxy.port, "DELETE", "/nocontent")
    assert (r.status, r.body, r.header("X-N")) == (204, b"", "1")


def test_forwarded_headers(proxy, upstream):
    r = request(
        proxy.port,
        "GET",
        "/fwd",
        [
            ("Host", "app.example"),
            ("X-Forwarded-For", "203.0.113.9"),
            ("Via", "1.1 edge"),
            ("X-A", "1"),
            ("X-Forwarded-For", "198.51.100.7"),
            ("Connection", "X-Drop"),
            ("X-Drop", "x"),
            ("Proxy-Authorization", "p"),
        ],
    )
    assert r.status == 200
    _, target, headers, _ = upstream.requests[-1]
    assert target == "/fwd"
    assert headers == [
        ("Host", "app.example"),
        ("X-Forwarded-For", "203.0.113.9, 198.51.100.7, 127.0.0.1"),
        ("Via", "1.1 edge, 1.1 netlimit"),
        ("X-A", "1"),
    ]
    n = len(upstream.requests)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:  # no Host at all: 400, as nginx
        s.sendall(b"GET /nohost HTTP/1.1\r\n\r\n")
        assert read_response(s.makefile("rb"))[0] == 400
    assert len(upstream.requests) == n


def test_over_limit_never_reaches_the_upstream_and_drops_an_unread_body(proxy, upstream):
    who = {"X-Forwarded-For": "198.51.100.1"}
    assert request(proxy.port, "GET", "/first", who).status == 200
    n = len(upstream.requests)
    r = request(proxy.port, "GET", "/second", who)
    assert (r.status, r.header("Retry-After")) == (429, "3600")
    assert r.json()["rule"] == "one"
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        # the body never comes: the 429 is sent at once and the connection closed
        s.sendall(b"POST /x HTTP/1.1\r\nHost: t\r\nX-Forwarded-For: 198.51.100.1\r\nContent-Length: 999999\r\n\r\nab")
        f = s.makefile("rb")
        st, hs, _, closing = read_response(f, "POST")
        assert (st, closing) == (429, True)
        assert f.read() == b""
    assert len(upstream.requests) == n


def test_upstream_failures(proxy):
    r = request(proxy.port, "GET", "/hangup")
    assert (r.status, r.json()["detail"]) == (502, "the upstream application closed the connection before answering")
    assert r.header("X-RateLimit-Limit") == "100000"
    r = request(proxy.port, "GET", "/garbage")
    assert (r.status, r.json()["detail"]) == (502, "the upstream application sent an invalid response")
    t0 = time.monotonic()
    r = request(proxy.port, "GET", "/slow")  # --upstream-timeout 1
    assert (r.status, r.json()["title"]) == (504, "Gateway Timeout")
    assert 0.9 <= time.monotonic() - t0 < 2.9
    # a body broken off after the head: the client must not get a "complete" response
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        s.sendall(b"GET /broken HTTP/1.1\r\nHost: t\r\n\r\n")
        with pytest.raises(http.client.IncompleteRead):
            read_response(s.makefile("rb"))
    # the upstream answers before reading the body: the answer reaches the client
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        s.sendall(b"POST /early HTTP/1.1\r\nHost: t\r\nContent-Length: 100000000\r\n\r\n" + b"z" * 65536)
        st, _, body, closing = read_response(s.makefile("rb"), "POST")
        assert (st, body, closing) == (413, b"big", True)
    assert request(proxy.port, "GET", "/fine").status == 200


def test_pooled_connection_closed_by_the_upstream_is_retried(proxy, upstream):
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    try:
        conn.request("GET", "/warm")  # leaves a pooled upstream connection
        conn.getresponse().read()
        before = upstream.accepts
        conn.request("GET", "/flaky")  # the upstream drops it without an answer: retried on a new one
        resp = conn.getresponse()
        assert (resp.status, resp.read().split(b" #")[0]) == (200, b"GET /flaky")
        assert upstream.accepts == before + 1
    finally:
        conn.close()


def test_http10_chunked_uploads_and_pipelines_on_one_path(proxy, upstream):
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        s.sendall(b"GET /old HTTP/1.0\r\nHost: t\r\n\r\n")
        f = s.makefile("rb")
        st, _, body, _ = read_response(f)
        assert (st, body.split(b" #")[0]) == (200, b"GET /old")
    _, _, headers, _ = upstream.requests[-1]
    assert ("Via", "1.0 netlimit") in headers
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:  # chunked upload
        s.sendall(b"POST /chunks HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
        st, _, body, _ = read_response(s.makefile("rb"), "POST")
        assert (st, body.split(b" #")[0]) == (200, b"POST /chunks")
    assert upstream.requests[-1][3] == b"abc"
    # the upstream gets the chunked upload re-framed with its length
    _, _, headers, _ = upstream.requests[-1]
    assert ("Content-Length", "3") in headers and not any(k == "Transfer-Encoding" for k, _ in headers)
    # a pipeline with a chunked upload in the middle keeps working
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as s:
        s.sendall(
            b"GET /first HTTP/1.1\r\nHost: t\r\n\r\n"
            b"POST /second HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"
            b"GET /third HTTP/1.1\r\nHost: t\r\n\r\n"
        )
        f = s.makefile("rb")
        assert read_response(f)[2].startswith(b"GET /first #")
        assert read_response(f, "POST")[2].startswith(b"POST /second #")
        assert read_response(f)[2].startswith(b"GET /third #")


def test_upstream_down_is_502_on_the_fast_path(tmp_path):
    cfg = write_config(tmp_path / "p.yaml", CONFIG)
    sc = Sidecar(cfg, "--upstream", f"http://127.0.0.1:{free_port()}")
    try:
        with socket.create_connection(("127.0.0.1", sc.port), timeout=10) as s:
            s.sendall(b"GET /x HTTP/1.1\r\nHost: t\r\n\r\nGET /y HTTP/1.1\r\nHost: t\r\n\r\n")
            f = s.makefile("rb")
            for _ in range(2):  # the connection survives a 502
                st, hs, body, _ = read_response(f)
                assert st == 502
                assert json.loads(body) == {
                    "type": "about:blank",
                    "title": "Bad Gateway",
                    "status": 502,
                    "detail": "the upstream application is unreachable",
                }
                assert header(hs, "Content-Type") == "application/problem+json; charset=utf-8"
    finally:
        sc.stop()


def test_with_a_redis_store_the_decision_is_asynchronous(tmp_path, redis_server, upstream):
    """Body bytes that arrive while the (Redis) decision is pending are forwarded
    after the head, in order; the 429 comes from the shared store."""
    cfg = write_config(tmp_path / "r.yaml", CONFIG)
    sc = Sidecar(cfg, "--upstream", upstream.url, "--redis", redis_server.url)
    try:
        with socket.create_connection(("127.0.0.1", sc.port), timeout=10) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.sendall(b"PUT /redis-body HTTP/1.1\r\nHost: t\r\nContent-Length: 12\r\n\r\nfirst")
            time.sleep(0.05)
            s.sendall(b"-second")
            f = s.makefile("rb")
            st, hs, body, _ = read_response(f)
            assert (st, body.split(b" #")[0]) == (200, b"PUT /redis-body")
            assert header(hs, "X-RateLimit-Limit") == "100000"
            s.sendall(b"GET /two HTTP/1.1\r\nHost: t\r\n\r\n")
            assert read_response(f)[2].startswith(b"GET /two #")
        assert upstream.requests[-2][3] == b"first-second"
        who = {"X-Forwarded-For": "198.51.100.1"}
        assert request(sc.port, "GET", "/r1", who).status == 200
        assert request(sc.port, "GET", "/r2", who).status == 429
    finally:
        sc.stop()
