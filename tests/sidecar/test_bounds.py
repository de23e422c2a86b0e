"""Every bound of the front door, hit on purpose with raw sockets against a real
sidecar in proxy mode: the timeouts (head, body, keep-alive, send), the
connection caps of the two listeners, the hard pipeline bound, uploads slower
than the upstream timeout, and upstream responses with broken framing.

Each test starts its own sidecar with small limits (so that it is fast and
cannot disturb another), and an upstream that is a plain socket server: it
answers by path, and can hang, or send a response that never ends."""

from __future__ import annotations

import re
import socket
import threading
import time

import pytest
from logging_upstream import LoggingUpstream
from sidecar_proc import Sidecar, get_metrics, metric, request, wait_until, write_config

pytestmark = pytest.mark.timeout(120)

CONFIG = """\
version: 1
http:
  domain: web
  actions: [[remote_address]]
  descriptors:
    - key: remote_address
      rate_limit: {unit: second, requests_per_unit: 100000000, name: everyone}
"""


class RawUpstream:
    """An application that answers by the request's path, byte for byte:

    * ``/hang``: reads the request, never answers;
    * ``/huge``: a 200 with a body of 1 GiB, sent as fast as the sidecar takes it;
      ``closed`` is set when the sidecar closes the connection under it;
    * ``/cl-superscript``, ``/cl-5000``: a 200 whose Content-Length is ``²`` or 5000 digits;
    * anything else: a short 200;

    and a connection idle for more than ``keepalive`` seconds is closed when its
    next request arrives, unanswered (an application's keep-alive timeout
    meeting a request: the close races the request).
    """

    keepalive = 4.5

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.stopped = False
        self.closed = threading.Event()
        self.conns: list[socket.socket] = []
        self.requests = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def stop(self) -> None:
        self.stopped = True
        self.sock.close()
        with self.lock:
            for c in self.conns:
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
                self.conns.append(c)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket) -> None:
        buf = b""
        c.settimeout(60)
        last = time.monotonic()
        try:
            while not self.stopped:
                while b"\r\n\r\n" not in buf:
                    data = c.recv(65536)
                    if not data:
                        return
                    buf += data
                if time.monotonic() - last > self.keepalive:
                    return  # it timed out just as the request came
                last = time.monotonic()
                head, _, buf = buf.partition(b"\r\n\r\n")
                m = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
                need = int(m.group(1)) if m else 0
                while len(buf) < need:
                    data = c.recv(65536)
                    if not data:
                        return
                    buf += data
                buf = buf[need:]
                with self.lock:
                    self.requests += 1
                path = head.split(b" ", 2)[1]
                if path == b"/hang":
                    time.sleep(60)
                    return
                if path == b"/huge":
                    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (1 << 30))
                    block = b"x" * 65536
                    try:
                        for _ in range((1 << 30) // len(block)):
                            c.sendall(block)
                    except OSError:
                        self.closed.set()
                    return
                if path == b"/cl-superscript":
                    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: \xc2\xb2\r\n\r\nab")
                elif path == b"/cl-5000":
                    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\nab")
                else:
                    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        except OSError:
            pass
        finally:
            c.close()


@pytest.fixture
def raw_upstream():
    u = RawUpstream()
    try:
        yield u
    finally:
        u.stop()


@pytest.fixture
def sidecar(tmp_path):
    """sidecar(upstream_url, *flags): a sidecar in proxy mode, stopped after the test."""
    made: list[Sidecar] = []

    def make(upstream: str, *flags: str) -> Sidecar:
        cfg = write_config(tmp_path / f"n{len(made)}.yaml", CONFIG)
        sc = Sidecar(cfg, "--upstream", upstream, *flags)
        made.append(sc)
        return sc

    try:
        yield make
    finally:
        for sc in made:
            sc.stop()


def connect(port: int, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout)


def read_until_closed(s: socket.socket, limit: float) -> tuple[bytes, bool]:
    """What arrives until the peer closes (True) or ``limit`` seconds pass (False)."""
    out = b""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        s.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            data = s.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return out, True
        if not data:
            return out, True
        out += data
    return out, False


def statuses(raw: bytes) -> list[int]:
    return [int(m) for m in re.findall(rb"HTTP/1\.[01] (\d{3}) ", raw)]


def scrape(sc: Sidecar, name: str, **labels) -> float:
    return metric(get_metrics(sc.admin_port), name, **labels)


# --- the timeouts -----------------------------------------------------------------------------------


def test_a_body_that_stops_arriving_is_cut_at_the_body_timeout(sidecar, raw_upstream):
    sc = sidecar(raw_upstream.url, "--body-timeout", "1", "--request-buffer", "1000")
    with connect(sc.port) as s:
        t0 = time.monotonic()
        s.sendall(b"POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
        out, closed = read_until_closed(s, 8)
        took = time.monotonic() - t0
    assert statuses(out) == [408] and closed
    assert 0.9 <= took < 4, took
    assert raw_upstream.requests == 0  # nothing of it reached the application
    assert scrape(sc, "netlimit_http_connection_timeouts_total", listener="main", kind="body") == 1


def test_an_idle_keep_alive_connection_is_closed_at_the_keepalive_timeout(sidecar, raw_upstream):
    sc = sidecar(raw_upstream.url, "--keepalive-timeout", "1")
    with connect(sc.port) as s:
        s.sendall(b"GET /a HTTP/1.1\r\nHost: a\r\n\r\n")
        t0 = time.monotonic()
        out, closed = read_until_closed(s, 8)
        took = time.monotonic() - t0
    assert statuses(out) == [200] and closed
    assert 0.9 <= took < 4, took
    assert scrape(sc, "netlimit_http_connection_timeouts_total", listener="main", kind="keepalive") == 1


def test_empty_lines_do_not_keep_a_connection_open(sidecar, raw_upstream):
    """CR LF before a request line is skipped (llhttp, as nginx): a client sending
    only that, forever, is idle, and closed at the keep-alive timeout."""
    sc = sidecar(raw_upstream.url, "--keepalive-timeout", "1", "--header-timeout", "30")
    with connect(sc.port) as s:
        t0 = time.monotonic()
        closed = False
        while not closed and time.monotonic() - t0 < 8:
            try:
                s.sendall(b"\r\n")
            except OSError:
                break
            out, closed = read_until_closed(s, 0.3)
        took = time.monotonic() - t0
    assert closed and 0.9 <= took < 4, took


def test_a_client_that_pipelines_and_never_reads_is_aborted_at_the_send_timeout(sidecar, raw_upstream):
    """Its answers stop leaving: after --send-timeout the connection is aborted (a
    plain close would wait for ever for the client to read them), so its
    descriptor and buffers are freed."""
    sc = sidecar(raw_upstream.url, "--send-timeout", "1")
    s = connect(sc.port)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        s.setblocking(False)
        req = b"GET /p HTTP/1.1\r\nHost: a\r\n\r\n" * 1000
        t0 = time.monotonic()
        gone = False
        while time.monotonic() - t0 < 20 and not gone:
            try:
                s.send(req)
            except BlockingIOError:
                time.sleep(0.05)  # the sidecar stopped reading: its answers are not leaving
            except OSError:
                gone = True  # reset by the sidecar
            if not gone and time.monotonic() - t0 > 1:
                gone = scrape(sc, "netlimit_http_connection_timeouts_total", listener="main", kind="send") >= 1
        assert gone, "the never-reading client was never cut off"
        wait_until(lambda: sc.admin("/healthz").json()["connections"] == 0, 10, what="its connection gone")
    finally:
        s.close()
    assert scrape(sc, "netlimit_http_connection_timeouts_total", listener="main", kind="send") == 1


def test_a_stalled_client_releases_the_upstream_connection_at_the_send_timeout(sidecar, raw_upstream):
    """A proxied response the client does not read: the client connection is aborted
    after --send-timeout, and the upstream connection is closed with it (not held
    for the upstream's next 1 GiB)."""
    sc = sidecar(raw_upstream.url, "--send-timeout", "1")
    s = connect(sc.port)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        s.sendall(b"GET /huge HTTP/1.1\r\nHost: a\r\n\r\n")
        assert raw_upstream.closed.wait(15), "the upstream connection was held"
        wait_until(lambda: sc.admin("/healthz").json()["connections"] == 0, 10, what="the client connection gone")
    finally:
        s.close()
    assert scrape(sc, "netlimit_http_connection_timeouts_total", listener="main", kind="send") == 1


def test_a_client_that_ends_in_the_middle_of_a_head_is_closed_at_once(sidecar, raw_upstream):
    """A half-close after part of a head: nothing can complete it, so the connection
    closes now (as nginx does), not at the header timeout."""
    sc = sidecar(raw_upstream.url, "--header-timeout", "30")
    with connect(sc.port) as s:
        s.sendall(b"GET /a HTTP/1.1\r\nHo")
        s.shutdown(socket.SHUT_WR)
        t0 = time.monotonic()
        out, closed = read_until_closed(s, 10)
    assert closed and out == b"" and time.monotonic() - t0 < 3


# --- connection caps ----------------------------------------------------------------------------------


def test_at_the_cap_the_slowest_head_makes_room_for_a_new_client(sidecar, raw_upstream):
    """Connections each sending one byte per second fill --max-connections; a head in
    progress is not idle, but it is shed (the slowest first) for a new client, who
    is served at once, not after the header timeout (30 s)."""
    sc = sidecar(raw_upstream.url, "--max-connections", "20", "--header-timeout", "30")
    slow = []
    stop = threading.Event()

    def trickle() -> None:
        line = b"GET /slow HTTP/1.1\r\nHost: a\r\nX-Pad: " + b"a" * 100
        for i in range(len(line)):
            if stop.wait(1.0):
                return
            for s in list(slow):
                try:
                    s.send(line[i : i + 1])
                except OSError:
                    pass

    try:
        for _ in range(20):
            s = connect(sc.port)
            s.sendall(b"G")
            slow.append(s)
        threading.Thread(target=trickle, daemon=True).start()
        wait_until(lambda: sc.admin("/healthz").json()["connections"] == 20, 10, what="20 slow connections")
        t0 = time.monotonic()
        r = request(sc.port, "GET", "/new", timeout=5)
        assert r.status == 200 and time.monotonic() - t0 < 3
        h = sc.admin("/healthz").json()
        assert h["connections_shed"] >= 1 and h["connections"] <= 20
        # the one shed is the oldest head
        slow[0].settimeout(3)
        assert read_until_closed(slow[0], 3)[1]
    finally:
        stop.set()
        for s in slow:
            s.close()


def test_a_flood_on_the_proxy_cannot_lock_operators_out_of_the_admin_listener(sidecar, raw_upstream):
    """The proxy listener full of busy connections (each waiting on the application:
    nothing to shed) refuses a new client; /healthz and /metrics on the admin
    listener still answer, from their own connections and cap."""
    sc = sidecar(raw_upstream.url, "--max-connections", "16", "--upstream-timeout", "60")
    busy = []
    try:
        for _ in range(16):
            s = connect(sc.port)
            s.sendall(b"GET /hang HTTP/1.1\r\nHost: a\r\n\r\n")
            busy.append(s)
        wait_until(lambda: raw_upstream.requests == 16, 10, what="16 requests waiting on the application")
        with connect(sc.port) as extra:  # the 17th: refused (reset), nothing idle to shed
            extra.sendall(b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
            out, closed = read_until_closed(extra, 5)
            assert closed and out == b""
        for _ in range(5):
            h = sc.admin("/healthz")
            assert h.status == 200 and h.json()["connections"] == 16
        m = get_metrics(sc.admin_port)
        assert metric(m, "netlimit_http_connections_refused_total", listener="main") >= 1
        assert metric(m, "netlimit_http_connections_refused_total", listener="admin") == 0
        assert metric(m, "netlimit_http_connections", listener="main") == 16
    finally:
        for s in busy:
            s.close()


# --- the pipeline bound ------------------------------------------------------------------------------------


def test_pipelined_requests_queue_no_more_than_the_bound(sidecar):
    """5,000 requests in one burst, each forwarded (an answer that waits): the queue of
    the connection never holds more than 32, however much one read brings, and
    every request is answered, in order."""
    app = LoggingUpstream()
    try:
        sc = sidecar(app.url)
        n = 5000
        raw = b"".join(b"GET /p%d HTTP/1.1\r\nHost: a\r\n\r\n" % i for i in range(n))
        with connect(sc.port, timeout=30) as s:
            threading.Thread(target=s.sendall, args=(raw + b"GET /end HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",),
                             daemon=True).start()  # fmt: skip
            out, closed = read_until_closed(s, 60)
        assert closed and statuses(out) == [200] * (n + 1)
        with app.lock:
            assert [t for _, t, _ in app.requests] == [f"/p{i}" for i in range(n)] + ["/end"]
        queued = scrape(sc, "netlimit_http_pipeline_queued_max", listener="main")
        assert 2 <= queued <= 32, queued
    finally:
        app.stop()


# --- uploads slower than the upstream timeout --------------------------------------------------------------


def test_an_upload_pausing_longer_than_the_upstream_timeout_is_not_cut(sidecar):
    """A body streamed past --request-buffer: while the client is still uploading
    (within --body-timeout) the upstream timeout does not run."""
    app = LoggingUpstream()
    try:
        sc = sidecar(app.url, "--request-buffer", "10", "--upstream-timeout", "1", "--body-timeout", "10")
        with connect(sc.port, timeout=10) as s:
            s.sendall(b"POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n" + b"x" * 50)
            time.sleep(2.5)  # the pause under test: longer than the upstream timeout
            s.sendall(b"y" * 50 + b"GET /next HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            out, closed = read_until_closed(s, 10)
        assert statuses(out) == [200, 200], out[:300]
        with app.lock:
            assert [(m, t, b) for m, t, b in app.requests] == [("POST", "/up", b"x" * 50 + b"y" * 50),
                                                                ("GET", "/next", b"")]  # fmt: skip
    finally:
        app.stop()


def test_an_upstream_that_stops_answering_still_gets_504(sidecar, raw_upstream):
    """The other side of the same clock: once the request is sent, the upstream's
    silence is bounded by --upstream-timeout."""
    sc = sidecar(raw_upstream.url, "--upstream-timeout", "1")
    t0 = time.monotonic()
    r = request(sc.port, "GET", "/hang", timeout=10)
    assert r.status == 504 and 0.9 <= time.monotonic() - t0 < 5


def test_a_pooled_connection_is_not_kept_past_common_keep_alive_timeouts(sidecar, raw_upstream):
    """An application that closes connections idle for 4.5 s as the next request
    arrives: a POST (which cannot be retried) 5 s after the last request still goes
    on a fresh connection, not the stale pooled one, and gets its answer."""
    sc = sidecar(raw_upstream.url)
    assert request(sc.port, "POST", "/a", body=b"x").status == 200
    time.sleep(5)  # the idle time under test
    assert request(sc.port, "POST", "/b", body=b"y").status == 200


# --- broken upstream framing -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/cl-superscript", "/cl-5000"])
def test_an_upstream_response_with_a_broken_length_is_a_clean_502(sidecar, raw_upstream, path):
    sc = sidecar(raw_upstream.url)
    mark = sc.mark()
    for _ in range(3):
        t0 = time.monotonic()
        r = request(sc.port, "GET", path, timeout=10)
        assert r.status == 502 and time.monotonic() - t0 < 5
        assert r.json()["detail"] == "the upstream application sent an invalid response"
    assert request(sc.port, "GET", "/fine").status == 200  # and it goes on serving
    assert "Traceback" not in "\n".join(sc.log().splitlines()[mark:])
