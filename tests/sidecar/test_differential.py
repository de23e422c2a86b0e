"""Differential test of the front door: the same bytes go through the sidecar and
through nginx 1.22, each in front of its own recording application, and the
two applications must see the same requests.

For every input (the request-smuggling gadgets of defparam/smuggler, desync
classes of the kinds the HTTP Garden found -- its own payloads too when
$NETLIMIT_HTTP_GARDEN names a copy of them, scripts/http_garden.sh --,
hypothesis-generated and mutated pipelines; tests/sidecar/corpora/README.md
says where each came from):

* what the sidecar's application receives on that connection -- each
  request's method, target, body and framing (``Content-Length`` /
  ``Transfer-Encoding`` as forwarded, normalised so that "no body" is one
  thing) -- is exactly what nginx's application receives, **or** a prefix of
  it, ending where the sidecar refused the next request itself (a 4xx/5xx of
  its own on the client connection); never a request nginx did not forward,
  never a different split, never more after a refusal;
* every request the sidecar forwards is one it counted (the limiter's hits);
* every forwarded head is unambiguous (at most one ``Content-Length``, no
  ``Content-Length`` beside ``Transfer-Encoding``).

nginx runs with ``proxy_ignore_client_abort on``: the test half-closes its
connection after the bytes, which nginx otherwise takes for an abort (499)
and then forwards nothing, which would make any comparison vacuous.
"""

from __future__ import annotations

import codecs
import os
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httptools
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sidecar_proc import Nginx, Sidecar, get_metrics, metric, write_config

pytestmark = [pytest.mark.nginx, pytest.mark.timeout(600)]

CORPORA = Path(__file__).resolve().parent / "corpora"
CONFIG = """\
version: 1
http:
  domain: web
  actions:
    - [remote_address]
  descriptors:
    - key: remote_address
      rate_limit: {unit: second, requests_per_unit: 100000000, name: everyone}
"""


# --- the applications ---------------------------------------------------------------------------------


class _Split:
    """llhttp (strict) splitting what one upstream connection delivers."""

    def __init__(self, app: Recorder, conn: socket.socket):
        self.app, self.conn = app, conn
        self.url = b""
        self.body = b""
        self.framing: list[tuple[str, str]] = []
        self.parser: httptools.HttpRequestParser

    def on_message_begin(self) -> None:
        self.url, self.body, self.framing = b"", b"", []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        n = name.decode("latin-1").lower()
        if n in ("content-length", "transfer-encoding"):
            self.framing.append((n, value.decode("latin-1")))

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        method = self.parser.get_method().decode()
        with self.app.lock:
            self.app.requests.append((method, self.url.decode("latin-1"), self.body, tuple(self.framing)))
        try:
            self.conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        except OSError:
            pass


class Recorder:
    """The application behind one front door: records every request it receives
    (method, target, body, framing headers as sent) and answers each with 200."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.requests: list[tuple[str, str, bytes, tuple]] = []
        self.bad = 0  # connections whose bytes llhttp refused
        self.lock = threading.Lock()
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def count(self) -> int:
        with self.lock:
            return len(self.requests)

    def since(self, n: int) -> list:
        with self.lock:
            return list(self.requests[n:])

    def stop(self) -> None:
        self.stopped = True
        self.sock.close()

    def _accept(self) -> None:
        while not self.stopped:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket) -> None:
        split = _Split(self, c)
        p = split.parser = httptools.HttpRequestParser(split)
        c.settimeout(60)
        try:
            while True:
                data = c.recv(65536)
                if not data:
                    break
                try:
                    p.feed_data(data)
                except httptools.HttpParserError:
                    with self.lock:
                        self.bad += 1
                    break
        except OSError:
            pass
        finally:
            c.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    app_s, app_n = Recorder(), Recorder()
    cfg = write_config(tmp_path_factory.mktemp("diff") / "n.yaml", CONFIG)
    sc = ng = None
    try:
        sc = Sidecar(cfg, "--upstream", app_s.url, "--header-timeout", "5", "--body-timeout", "5")
        ng = Nginx(
            f"""
            location / {{
                proxy_pass http://127.0.0.1:{app_n.port};
                proxy_http_version 1.1;
                proxy_set_header Connection "";
                proxy_ignore_client_abort on;
            }}
            """,
            app_n.port,
        )
        yield sc, ng, app_s, app_n
    finally:
        if ng is not None:
            ng.stop()
        if sc is not None:
            sc.stop()
        app_s.stop()
        app_n.stop()


# --- one comparison ---------------------------------------------------------------------------------------


def send(port: int, raw: bytes) -> bytes:
    """The bytes, a half-close, and everything until the server closes (bounded)."""
    with socket.create_connection(("127.0.0.1", port), timeout=8) as s:
        try:
            s.sendall(raw)
            s.shutdown(socket.SHUT_WR)
        except OSError:  # refused and reset before all was sent
            pass
        out = b""
        deadline = time.monotonic() + 8
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


def framing(fields: tuple) -> tuple:
    """How the application delimits the body, as forwarded; no length and length 0
    are the same request."""
    te = tuple(v for n, v in fields if n == "transfer-encoding")
    cl = tuple(v for n, v in fields if n == "content-length")
    assert len(cl) <= 1 and not (cl and te), f"an ambiguous forwarded head: {fields}"
    return (te, None if cl in ((), ("0",)) else cl)


def normal(reqs: list) -> list:
    return [(m, t, b, framing(f)) for m, t, b, f in reqs]


def counted(sc: Sidecar) -> float:
    return metric(
        get_metrics(sc.admin_port, "/metrics"), "netlimit_http_rule_hits_total", domain="web", rule="everyone"
    )


_pool = ThreadPoolExecutor(2)


def check(stack, raw: bytes) -> tuple[list, list]:
    """Send ``raw`` to both; assert the rules of the module docstring; return
    (what the sidecar forwarded, what nginx forwarded)."""
    sc, ng, app_s, app_n = stack
    b_s, b_n, c0 = app_s.count(), app_n.count(), counted(sc)
    f_s = _pool.submit(send, sc.port, raw)
    f_n = _pool.submit(send, ng.port, raw)
    out_s, _ = f_s.result(), f_n.result()
    ours, theirs = normal(app_s.since(b_s)), normal(app_n.since(b_n))
    assert counted(sc) - c0 >= len(ours), "a request reached the application without a decision"
    if ours != theirs:
        assert ours == theirs[: len(ours)], (
            f"the sidecar forwarded what nginx did not:\n  ours  {ours}\n  nginx {theirs}"
        )
        codes = statuses(out_s)
        assert len(codes) > len(ours) and codes[len(ours)] >= 400, (
            f"the sidecar forwarded less than nginx without refusing the next request:\n  ours  {ours}\n"
            f"  nginx {theirs}\n  answers {codes}"
        )
    return ours, theirs


# --- the corpora -----------------------------------------------------------------------------------------------


def _smuggler_gadgets() -> dict[str, bytes]:
    """defparam/smuggler's configs/default.py, run with a stub Payload."""

    class Payload:
        header = ""

    scope: dict = {"Payload": Payload, "mutations": {}}
    exec((CORPORA / "smuggler" / "default.py.txt").read_text(), scope)
    out = {}
    for name, p in scope["mutations"].items():
        # the gadget is the header line between the request line and Host
        gadget = p.header.split("\r\n", 1)[1].split("\r\nHost: __HOST__", 1)[0]
        out[name] = gadget.encode("latin-1")
    return out


GADGETS = _smuggler_gadgets()
_SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n"
# CL.TE: a front end that reads Content-Length forwards it all; one that reads
# chunked stops at "0" and takes the rest as a new request.  TE.CL: the reverse.
_BODIES = {"clte": b"0\r\n\r\n" + _SMUGGLED, "tecl": b"%x\r\n" % len(_SMUGGLED) + _SMUGGLED + b"\r\n0\r\n\r\n"}


def test_the_smuggler_corpus_is_whole():
    assert len(GADGETS) == 134
    assert GADGETS["tabprefix2"] == b"Transfer-Encoding\t:\tchunked"


@pytest.mark.parametrize("gadget", sorted(GADGETS))
def test_smuggler_gadgets(stack, gadget):
    for kind, body in _BODIES.items():
        cl = 4 if kind == "tecl" else len(body)
        raw = (
            b"POST /form HTTP/1.1\r\n" + GADGETS[gadget] + b"\r\nHost: a\r\nContent-Length: %d\r\n\r\n" % cl + body
            + b"GET /next HTTP/1.1\r\nHost: a\r\n\r\n"
        )  # fmt: skip
        check(stack, raw)


def _garden() -> dict[str, bytes]:
    """The HTTP Garden's payloads (narfindustries/http-garden, TROPHIES.md: every HTTP/1.1
    "Payload:" of its server and transducer bugs), when $NETLIMIT_HTTP_GARDEN names a copy
    of that file: the Garden is GPL-3.0, so netlimit does not ship it
    (scripts/http_garden.sh fetches it and runs these)."""
    path = os.environ.get("NETLIMIT_HTTP_GARDEN")
    if not path:
        return {}
    out: dict[str, bytes] = {}
    section, number = "", ""
    for line in Path(path).read_text().splitlines():
        if line.startswith(("## ", "### ")):  # "### Server Bugs", "## Transducer Bugs", then the bonus ones
            section = "server" if "Server Bugs" in line else "transducer" if "Transducer Bugs" in line else ""
        elif m := re.match(r"(\d+)\. ", line):
            number = m.group(1)
        elif section and line.strip().startswith("- Payload: `"):
            # one or more `...` parts (stream pieces), sent here as one
            raw = "".join(re.findall(r"`([^`]*)`", line))
            out[f"{section}-{number}"] = codecs.escape_decode(raw.encode("latin-1"))[0]
    assert out, f"no payloads found in {path}"
    return out


GARDEN = _garden()
if GARDEN:

    @pytest.mark.parametrize("name", sorted(GARDEN))
    def test_http_garden_payloads(stack, name):
        raw = GARDEN[name]
        check(stack, raw)
        check(stack, raw + b"GET /after HTTP/1.1\r\nHost: a\r\n\r\n")  # and what follows it


# Desync classes of the kinds the HTTP Garden found in real servers and proxies,
# written here from the RFC 9112 rules they bend (framing: §6, chunks: §7, field
# syntax: §5): each must reach the application as nginx's does, or be refused.
DESYNC = {
    "cl-twice-differ": b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 0\r\n\r\nZ",
    "cl-list": b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1, 1\r\n\r\nZ",
    "cl-plus": b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +1\r\n\r\nZ",
    "cl-leading-zeros": b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0001\r\n\r\nZ",
    "cl-hex": b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x1\r\n\r\nZ",
    "cl-underscore": b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1_0\r\n\r\nZZZZZZZZZZ",
    "cl-inner-space": b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1 0\r\n\r\nZZZZZZZZZZ",
    "cl-overflow": b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 18446744073709551617\r\n\r\nZ",
    "te-chunked-twice": b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n",
    "te-two-lines": b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n"
    b"0\r\n\r\n",
    "te-obs-fold": b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n",
    "te-vtab": b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: \x0bchunked\r\n\r\n0\r\n\r\n",
    "te-and-cl": b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
    "chunk-size-space": b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n 5\r\nhello\r\n0\r\n\r\n",
    "chunk-size-0x": b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n",
    "chunk-size-overflow": b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"10000000000000005\r\nhello\r\n0\r\n\r\n",
    "chunk-ext-bare-cr": b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5;a\rb\r\nhello\r\n0\r\n\r\n",
    "chunk-ext-quoted-crlf": b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
    b'5;a="\r\n0\r\n\r\n"\r\nhello\r\n0\r\n\r\n',
    "chunk-data-too-long": b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX\r\n0\r\n\r\n",
    "chunk-lf-only": b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\n0\n\n",
    "chunk-trailer-space-in-name": b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"0\r\nX Y: z\r\n\r\n",
    "chunk-trailer-length": b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"0\r\nContent-Length: 5\r\n\r\nhello",
    "field-bare-cr": b"GET / HTTP/1.1\r\nHost: a\r\nX: a\rb\r\n\r\n",
    "field-lf-only": b"GET / HTTP/1.1\nHost: a\n\n",
    "field-space-before-colon": b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length : 5\r\n\r\nhello",
    "field-name-nul": b"GET / HTTP/1.1\r\nHost: a\r\nX\x00: a\r\n\r\n",
    "field-obs-fold": b"GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n b\r\n\r\n",
    "field-high-bytes": b"GET / HTTP/1.1\r\nHost: a\r\nX: \xff\xfe\r\n\r\n",
    "line-two-spaces": b"GET  / HTTP/1.1\r\nHost: a\r\n\r\n",
    "line-trailing-space": b"GET / HTTP/1.1 \r\nHost: a\r\n\r\n",
    "line-lowercase-version": b"GET / http/1.1\r\nHost: a\r\n\r\n",
    "line-version-leading-zero": b"GET / HTTP/01.1\r\nHost: a\r\n\r\n",
    "host-list": b"GET / HTTP/1.1\r\nHost: a, b\r\n\r\n",
    "expect-chunked": b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5\r\nhello\r\n0\r\n\r\n",
    "get-with-body": b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhelloGET /b HTTP/1.1\r\nHost: a\r\n\r\n",
    "head-with-body": b"HEAD / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
}


@pytest.mark.parametrize("name", sorted(DESYNC))
def test_desync_classes(stack, name):
    raw = DESYNC[name]
    check(stack, raw)
    check(stack, raw + b"GET /after HTTP/1.1\r\nHost: a\r\n\r\n")  # and what follows it


# --- front-door vectors of issue 22, with what nginx answers -------------------------------------------------------

VECTORS = {
    "connection-names-content-length": b"POST /f HTTP/1.1\r\nHost: a\r\nConnection: Content-Length\r\n"
    b"Content-Length: 32\r\n\r\nGET /login HTTP/1.1\r\nHost: a\r\n\r\n",
    "http-2.0": b"GET /a HTTP/2.0\r\nHost: a\r\n\r\n",
    "http-0.9": b"GET /a HTTP/0.9\r\nHost: a\r\n\r\n",
    "http-1.2": b"GET /a HTTP/1.2\r\nHost: a\r\n\r\n",
    "rtsp": b"GET /a RTSP/1.0\r\nHost: a\r\n\r\nGET /b HTTP/1.1\r\nHost: a\r\n\r\n",
    "pri-preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    "connect": b"CONNECT 127.0.0.1:22 HTTP/1.1\r\nHost: a\r\n\r\n",
    "absolute-form": b"GET http://evil.example/x?y=1 HTTP/1.1\r\nHost: a\r\n\r\n",
    "asterisk": b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n",
    "tab-in-target": b"GET /login\t HTTP/1.1\r\nHost: a\r\n\r\n",
    "no-host": b"GET /a HTTP/1.1\r\n\r\n",
    "http10-chunked": b"POST /a HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "chunked-body": b"POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    b"GET /b HTTP/1.1\r\nHost: a\r\n\r\n",
    "chunk-ext": b"POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n0\r\n\r\n",
    "expect": b"POST /a HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nhi",
    "pipeline": b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\nGET /3 HTTP/1.0\r\n\r\n",
    "half-body": b"POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nhello",
    "half-head": b"GET /a HTTP/1.1\r\nHost: a\r\n\r\nGET /b HTTP/1.1\r\nHo",
    # what the comparison found nginx refusing and llhttp taking (the sidecar now refuses them)
    "te-comma-chunked": b"POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: ,chunked\r\n\r\n0\r\n\r\n",
    "te-gzip-chunked": b"POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
    "path-above-root": b"GET /%2e%2e/login HTTP/1.1\r\nHost: a\r\n\r\n",
    "path-above-root-2f": b"GET /a%2f..%2f..%2flogin HTTP/1.1\r\nHost: a\r\n\r\n",
    "path-bad-escape": b"GET /a%zz HTTP/1.1\r\nHost: a\r\n\r\n",
    "path-nul": b"GET /a%00 HTTP/1.1\r\nHost: a\r\n\r\n",
    "two-hosts-http10": b"GET /a HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n",
    "two-if-match": b"GET /a HTTP/1.1\r\nHost: a\r\nIf-Match: x\r\nIf-Match: y\r\n\r\n",
    "two-authorization": b"GET /a HTTP/1.1\r\nHost: a\r\nAuthorization: x\r\nAuthorization: y\r\n\r\n",
    "host-empty": b"GET /a HTTP/1.1\r\nHost: \r\n\r\n",
    "host-slash": b"GET /a HTTP/1.1\r\nHost: a/b\r\n\r\n",
    "host-dotdot": b"GET /a HTTP/1.1\r\nHost: a..b\r\n\r\n",
    "host-tab": b"GET /a HTTP/1.1\r\nHost:\ta\r\n\r\n",
    "length-tab": b"POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 5\t\r\n\r\nhello",
    "absolute-form-bad-host": b"GET http://a_b/x HTTP/1.1\r\nHost: a\r\n\r\n",
    "absolute-form-bad-port": b"GET http://h:8a/x HTTP/1.1\r\nHost: a\r\n\r\n",
}
#: what nginx refuses there, and so must the sidecar (forwarding nothing)
REFUSED = {
    "http-2.0", "http-0.9", "rtsp", "pri-preface", "connect", "asterisk", "tab-in-target", "no-host",
    "http10-chunked", "half-body", "te-comma-chunked", "te-gzip-chunked", "path-above-root",
    "path-above-root-2f", "path-bad-escape", "path-nul", "two-hosts-http10", "two-if-match", "two-authorization",
    "host-empty", "host-slash", "host-dotdot", "host-tab", "length-tab", "absolute-form-bad-host",
    "absolute-form-bad-port",
}  # fmt: skip
#: what nginx forwards and the sidecar refuses (llhttp's stricter grammar): allowed
STRICTER = {"http-1.2"}


@pytest.mark.parametrize("name", sorted(VECTORS))
def test_front_door_vectors(stack, name):
    ours, theirs = check(stack, VECTORS[name])
    if name in REFUSED:
        assert ours == theirs == [], (ours, theirs)
    elif name in STRICTER:
        assert ours == [] and theirs, (ours, theirs)
    else:
        assert ours == theirs and ours, (ours, theirs)


def test_the_comparison_is_not_vacuous(stack):
    """nginx forwards what the test sends (the half-close does not abort it), a body
    split travels whole, and a refusal shows as a shorter list ending in an error."""
    ours, theirs = check(
        stack, b"POST /form HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhelloGET /two HTTP/1.1\r\nHost: a\r\n\r\n"
    )
    assert ours == theirs == [("POST", "/form", b"hello", ((), ("5",))), ("GET", "/two", b"", ((), None))]
    ours, theirs = check(stack, VECTORS["http-1.2"])  # nginx takes 1.2 for 1.1; llhttp refuses it
    assert ours == [] and theirs == [("GET", "/a", b"", ((), None))]
    ours, theirs = check(stack, VECTORS["chunked-body"])  # both re-frame the chunked body with its length
    assert ours == theirs == [("POST", "/a", b"hello", ((), ("5",))), ("GET", "/b", b"", ((), None))]


# --- generated and mutated pipelines ----------------------------------------------------------------------------------

_METHODS = st.sampled_from([b"GET", b"POST", b"HEAD", b"PUT", b"DELETE", b"OPTIONS", b"PATCH", b"CONNECT", b"PRI"])
_NAMES = st.sampled_from(
    [b"Host", b"Content-Length", b"Transfer-Encoding", b"Connection", b"X-Forwarded-For", b"X-A", b"Expect", b"TE",
     b"Upgrade", b"If-Match", b"Authorization", b"Content-Range", b"Trailer", b"Via", b"content-length"]
)  # fmt: skip
_VALUES = st.sampled_from(
    [b"a", b"0", b"5", b"12", b"chunked", b"close", b"keep-alive", b"Content-Length", b"identity, chunked",
     b"chunked, identity", b"100-continue", b"1.2.3.4", b" 5", b"5 ", b"+5", b"-1", b"0x5", b"\t5", b"5\t",
     b"chunked\t", b"Chunked", b"chunked ", b"a ", b"", b"a..b", b"[::1]:80", b"h:99999", b"websocket", b"upgrade", b"5, 5"]
)  # fmt: skip
_BODYPARTS = st.sampled_from(
    [b"", b"hello", b"0\r\n\r\n", b"5\r\nhello\r\n0\r\n\r\n", b"GET /x HTTP/1.1\r\n\r\n",
     b"5;a=b\r\nhello\r\n0\r\nX: y\r\n\r\n", b"3\r\nabc\r\n0\r\n\r\nGET /s HTTP/1.1\r\nHost: a\r\n\r\n"]
)  # fmt: skip
_NOISE = st.sampled_from(
    [b"\t", b"\x0b", b"\r", b"\n", b"\x00", b" ", b",", b":", b"\r\n", b"chunked", b"7", b"\xff", b"%", b"/..",
     b"\r\n\r\n", b"0\r\n\r\n", b"Transfer-Encoding: chunked\r\n", b"Content-Length: 3\r\n", b"HTTP/1.1"]
)  # fmt: skip
_VERSIONS = st.sampled_from([b"HTTP/1.1"] * 6 + [b"HTTP/1.0", b"HTTP/2.0", b"HTTP/0.9", b"RTSP/1.0", b"HTTP/1.2"])
_PATHS = st.sampled_from(
    [b"/", b"/a", b"/login", b"/a?b=c", b"/%2e%2e/x", b"/a/../b", b"/a/../..", b"http://h/x", b"https://h", b"*",
     b"/%zz", b"/a%00", b"//x", b"/a#f", b"h:80", b"/x?y=%zz"]
)  # fmt: skip


@st.composite
def _request(draw) -> bytes:
    headers = [b"Host: a"] + [draw(_NAMES) + b": " + draw(_VALUES) for _ in range(draw(st.integers(0, 4)))]
    path = draw(_PATHS)
    return b"%s %s %s\r\n%s\r\n\r\n%s" % (
        draw(_METHODS), path, draw(_VERSIONS), b"\r\n".join(headers), draw(_BODYPARTS)
    )  # fmt: skip


@st.composite
def _pipeline(draw) -> bytes:
    raw = b"".join(draw(st.lists(_request(), min_size=1, max_size=4)))
    for _ in range(draw(st.integers(0, 3))):  # a few mutations anywhere
        i = draw(st.integers(0, len(raw)))
        if draw(st.booleans()):
            raw = raw[:i] + draw(_NOISE) + raw[i:]
        else:
            raw = raw[:i] + raw[i + 1 :]
    return raw


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=_pipeline())
def test_generated_pipelines(stack, raw):
    check(stack, raw)
