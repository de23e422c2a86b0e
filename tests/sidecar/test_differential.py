"""Differential test of the proxy's framing: the same bytes go through the sidecar
and through nginx 1.22 to two recording upstreams, and are split by llhttp
alone.  Whatever the bytes, the application behind the sidecar must never see
a request the sidecar did not count, nor a different split of the bytes than
llhttp's (and, where both forward, nginx's).

Inputs: request-smuggling gadgets of defparam/smuggler (configs/default.py,
MIT licence, commit 2be871e: each Transfer-Encoding obfuscation inside a
CL.TE / TE.CL template, regenerated here rather than copied) and
hypothesis-generated, mutated pipelines of requests.
"""

from __future__ import annotations

import socket
import time

import httptools
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from logging_upstream import LoggingUpstream
from sidecar_proc import Nginx, Sidecar, get_metrics, metric, write_config

pytestmark = [pytest.mark.nginx, pytest.mark.timeout(300)]

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


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    app_s, app_n = LoggingUpstream(), LoggingUpstream()
    cfg = write_config(tmp_path_factory.mktemp("diff") / "n.yaml", CONFIG)
    sc = Sidecar(cfg, "--upstream", app_s.url, "--header-timeout", "5")
    ng = None
    try:
        ng = Nginx(
            f"""
            location / {{
                proxy_pass http://127.0.0.1:{app_n.port};
                proxy_http_version 1.1;
                proxy_set_header Connection "";
            }}
            """,
            app_n.port,
        )
        yield sc, ng, app_s, app_n
    finally:
        if ng is not None:
            ng.stop()
        sc.stop()
        app_s.stop()
        app_n.stop()


def send(port: int, raw: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
        s.sendall(raw)
        s.shutdown(socket.SHUT_WR)
        out = b""
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                data = s.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not data:
                break
            out += data
        return out


class _Ref:
    def __init__(self) -> None:
        self.url = b""
        self.out: list[tuple[str, str]] = []

    def on_message_begin(self) -> None:
        self.url = b""

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_message_complete(self) -> None:
        self.out.append((self.p.get_method().decode(), self.url.decode("latin-1")))


def llhttp_split(raw: bytes) -> list[tuple[str, str]]:
    """The complete requests llhttp (strict) finds in the bytes, up to its first error."""
    ref = _Ref()
    ref.p = httptools.HttpRequestParser(ref)
    try:
        ref.p.feed_data(raw)
    except httptools.HttpParserError:
        pass
    return ref.out


def seen(app: LoggingUpstream, before: int) -> list[tuple[str, str]]:
    with app.lock:
        return [(m, t) for m, t, _ in app.requests[before:]]


def counted(sc: Sidecar) -> float:
    return metric(
        get_metrics(sc.admin_port, "/metrics"), "netlimit_http_rule_hits_total", domain="web", rule="everyone"
    )


def check(stack, raw: bytes) -> None:
    sc, ng, app_s, app_n = stack
    b_s, b_n, c0 = app_s.count(), app_n.count(), counted(sc)
    send(sc.port, raw)
    send(ng.port, raw)
    ours, theirs, ref = seen(app_s, b_s), seen(app_n, b_n), llhttp_split(raw)
    assert counted(sc) - c0 >= len(ours), "a request reached the application without a decision"
    assert ours == ref[: len(ours)], f"a split llhttp does not make: {ours} vs {ref}"
    common = min(len(ours), len(theirs))
    assert ours[:common] == theirs[:common], f"nginx splits differently: {ours} vs {theirs}"


# --- the smuggler gadgets ---------------------------------------------------------------------------

_SPACES = [0x1, 0x4, 0x8, 0x9, 0xA, 0xB, 0xC, 0xD, 0x1F, 0x20, 0x7F, 0xA0, 0xFF]


def _gadgets() -> dict[str, bytes]:
    g = {
        "nameprefix1": b" Transfer-Encoding: chunked",
        "tabprefix1": b"Transfer-Encoding:\tchunked",
        "tabprefix2": b"Transfer-Encoding\t:\tchunked",
        "space1": b"Transfer-Encoding : chunked",
    }
    for i in _SPACES:
        c = bytes([i])
        g[f"midspace-{i:02x}"] = b"Transfer-Encoding:" + c + b"chunked"
        g[f"postspace-{i:02x}"] = b"Transfer-Encoding" + c + b": chunked"
        g[f"prespace-{i:02x}"] = c + b"Transfer-Encoding: chunked"
        g[f"endspace-{i:02x}"] = b"Transfer-Encoding: chunked" + c
        g[f"xprespace-{i:02x}"] = b"X: X" + c + b"Transfer-Encoding: chunked"
        g[f"endspacex-{i:02x}"] = b"Transfer-Encoding: chunked" + c + b"X: X"
        g[f"rxprespace-{i:02x}"] = b"X: X\r" + c + b"Transfer-Encoding: chunked"
        g[f"xnprespace-{i:02x}"] = b"X: X" + c + b"\nTransfer-Encoding: chunked"
        g[f"endspacerx-{i:02x}"] = b"Transfer-Encoding: chunked\r" + c + b"X: X"
        g[f"endspacexn-{i:02x}"] = b"Transfer-Encoding: chunked" + c + b"\nX: X"
    return g


GADGETS = _gadgets()
_SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n"
# CL.TE: a front end that reads Content-Length forwards it all; one that reads
# chunked stops at "0" and takes the rest as a new request.  TE.CL: the reverse.
_BODIES = {"clte": b"0\r\n\r\n" + _SMUGGLED, "tecl": b"%x\r\n" % len(_SMUGGLED) + _SMUGGLED + b"\r\n0\r\n\r\n"}


@pytest.mark.parametrize("gadget", sorted(GADGETS))
def test_smuggler_gadgets(stack, gadget):
    for kind, body in _BODIES.items():
        cl = 4 if kind == "tecl" else len(body)
        raw = (
            b"POST /form HTTP/1.1\r\n" + GADGETS[gadget] + b"\r\nHost: a\r\nContent-Length: %d\r\n\r\n" % cl + body
            + b"GET /next HTTP/1.1\r\nHost: a\r\n\r\n"
        )  # fmt: skip
        check(stack, raw)


# --- generated and mutated pipelines -------------------------------------------------------------------

_METHODS = st.sampled_from([b"GET", b"POST", b"HEAD", b"PUT", b"DELETE", b"OPTIONS"])
_NAMES = st.sampled_from(
    [b"Host", b"Content-Length", b"Transfer-Encoding", b"Connection", b"X-Forwarded-For", b"X-A", b"Expect", b"TE"]
)
_VALUES = st.sampled_from(
    [b"a", b"0", b"5", b"12", b"chunked", b"close", b"keep-alive", b"Content-Length", b"identity, chunked",
     b"chunked, identity", b"100-continue", b"1.2.3.4", b" 5", b"5 ", b"+5", b"-1", b"0x5"]
)  # fmt: skip
_BODYPARTS = st.sampled_from([b"", b"hello", b"0\r\n\r\n", b"5\r\nhello\r\n0\r\n\r\n", b"GET /x HTTP/1.1\r\n\r\n"])
_NOISE = st.sampled_from([b"\t", b"\x0b", b"\r", b"\n", b"\x00", b" ", b",", b":", b"\r\n", b"chunked", b"7", b"\xff"])


@st.composite
def _request(draw) -> bytes:
    headers = [b"Host: a"] + [draw(_NAMES) + b": " + draw(_VALUES) for _ in range(draw(st.integers(0, 4)))]
    path = draw(st.sampled_from([b"/", b"/a", b"/login", b"/a?b=c", b"/%2e%2e/x"]))
    return b"%s %s HTTP/1.1\r\n%s\r\n\r\n%s" % (draw(_METHODS), path, b"\r\n".join(headers), draw(_BODYPARTS))


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


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=_pipeline())
def test_generated_pipelines(stack, raw):
    check(stack, raw)


def test_the_comparison_is_not_vacuous(stack):
    """The same helper sees a forwarded request and a smuggling split when there is one."""
    sc, ng, app_s, app_n = stack
    b = app_s.count()
    check(
        stack, b"POST /form HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhelloGET /two HTTP/1.1\r\nHost: a\r\n\r\n"
    )
    assert seen(app_s, b) == [("POST", "/form"), ("GET", "/two")]
    assert llhttp_split(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n" + _SMUGGLED) == [
        ("POST", "/"),
        ("GET", "/smuggled"),
    ]
