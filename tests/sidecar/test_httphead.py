"""The fast paths' request-head parser and 200 formatter: the C module
(netlimit/sidecar/_httphead.c) and its Python twins (netlimit/sidecar/httphead.py)
give the same answer for every input, and both refuse (hand to aiohttp) what
the fast paths must not guess about."""

from __future__ import annotations

import email.utils
import time
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netlimit.sidecar import httphead


@pytest.fixture(scope="module")
def c():
    """The C module.  pip builds it with the package (scripts/setup.sh installs gcc
    and the Python headers): a missing build is a failure here, not a skip."""
    try:
        from netlimit.sidecar import _httphead
    except ImportError as e:  # pragma: no cover - the message is the point
        pytest.fail(f"netlimit/sidecar/_httphead.c is not built ({e}); reinstall with a C compiler: pip install -e .")
    assert httphead.IMPLEMENTATION == "c"
    return _httphead


def outcome(fn, *args):
    """("ok", answer) or ("raise", exception type)."""
    try:
        return ("ok", fn(*args))
    except Exception as e:  # compared
        return ("raise", type(e))


def same(c_fn, py_fn, *args):
    """Both implementations' outcomes, asserted equal; the answer."""
    a, b = outcome(c_fn, *args), outcome(py_fn, *args)
    assert a == b, f"C {a!r} != Python {b!r} for {args!r}"
    return a[1]


def same_with_fields(c, buf):
    """parse_request with a field list: equal answers and equal lists."""
    hc: list = []
    hp: list = []
    a, b = outcome(c.parse_request, buf, hc), outcome(httphead.py_parse_request, buf, hp)
    assert (a, hc) == (b, hp), f"C {a!r} {hc!r} != Python {b!r} {hp!r} for {buf!r}"


VALID = b"GET /v1/check?deny_status=403 HTTP/1.1\r\nHost: x\r\nX-Original-URI: /a?b=1\r\nConnection: keep-alive\r\n\r\n"


# -- explicit cases ---------------------------------------------------------------------

CASES = [
    (b"", None),
    (b"GET /v1/check HTTP/1.1\r\nHost: x\r\n", None),  # incomplete
    (b"GET /v1/check HTTP/1.1\r\nHost: x\r\n\r\n", True),
    (b"GET /v1/check HTTP/1.0\r\n\r\n", True),
    (b"GET /v1/check HTTP/2.0\r\n\r\n", False),
    (b"GET  /v1/check HTTP/1.1\r\n\r\n", False),  # three spaces
    (b"GET /v1/check\r\n\r\n", False),
    (b"GET /v1/check HTTP/1.1\nHost: x\r\n\r\n", False),  # bare LF
    (b"GET /v1/check HTTP/1.1\r\nHost: x\ry\r\n\r\n", False),  # bare CR
    (b"GET /v1/check HTTP/1.1\r\nHost: x\n\n", False),  # LF LF, no CRLF CRLF
    (b"GET /v1/check HTTP/1.1\r\nHost: x\r\n\r", None),
    (b"GET /v1/check HTTP/1.1\r\nHost : x\r\n\r\n", False),  # space before the colon
    (b"GET /v1/check HTTP/1.1\r\n Host: x\r\n\r\n", False),  # obs-fold / leading blank
    (b"GET /v1/check HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n", False),
    (b"GET /v1/check HTTP/1.1\r\nNoColon\r\n\r\n", False),
    (b"GET /v1/check HTTP/1.1\r\n: empty name\r\n\r\n", False),
    (b"GET /v1/check HTTP/1.1\r\nX\xe9: latin\r\n\r\n", False),  # not a token
    (b"GET /v1/check HTTP/1.1\r\nX-A: caf\xe9 \t\r\n\r\n", True),  # Latin-1 value, blanks stripped
    (b"GET /v1/check HTTP/1.1\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n", False),
    (b"GET /v1/check HTTP/1.1\r\nTransfer-Encoding: chunked\r\ntransfer-encoding: x\r\n\r\n", False),
    (b"GET /v1/check HTTP/1.1\r\nHost: a\r\nHOST: b\r\n\r\n", False),
    (b"GET /v1/check HTTP/1.1\r\nX-A: 1\r\nx-a: 2\r\n\r\n", True),  # first wins
    (b"GET /v1/check HTTP/1.1\r\n" + b"X: " + b"a" * 9000 + b"\r\n\r\n", False),  # too long
    (b"GET /v1/check HTTP/1.1\r\n" + b"X: " + b"a" * 9000, False),
    (VALID, True),
]


@pytest.mark.parametrize("buf,expect", CASES)
def test_cases(c, buf, expect):
    r = same(c.parse_request, httphead.py_parse_request, buf)
    if expect is True:
        assert isinstance(r, tuple)
    else:
        assert r is expect
    same_with_fields(c, buf)
    same(c.parse_check, httphead.py_parse_check, buf)


def test_fields_and_hs(c):
    hs: list = []
    end, method, target, http10, h = c.parse_request(VALID + b"NEXT", hs)
    assert VALID[end : end + 4] == b"\r\n\r\n" and end + 4 == len(VALID)
    assert (method, target, http10) == ("GET", "/v1/check?deny_status=403", False)
    assert h == {"host": "x", "x-original-uri": "/a?b=1", "connection": "keep-alive"}
    assert hs == [
        ("Host", "x", "host"),
        ("X-Original-URI", "/a?b=1", "x-original-uri"),
        ("Connection", "keep-alive", "connection"),
    ]


@pytest.mark.parametrize(
    "head,expect",
    [
        (b"GET /v1/check HTTP/1.1\r\n\r\n", (0, "GET", "", True, False)),
        (b"HEAD /v1/check?deny_status=403 HTTP/1.1\r\n\r\n", (0, "HEAD", "deny_status=403", True, False)),
        (b"POST /v1/check HTTP/1.1\r\n\r\n", False),
        (b"POST /v1/authz/x/y HTTP/1.1\r\n\r\n", (1, "POST", "", True, False)),
        (b"GET /v1/authz HTTP/1.0\r\n\r\n", (1, "GET", "", False, True)),
        (b"GET /v1/authzX HTTP/1.1\r\n\r\n", False),
        (b"GET /v1/checkX HTTP/1.1\r\n\r\n", False),
        (b"GET /healthz HTTP/1.1\r\n\r\n", False),
        (b"GET /v1/check HTTP/1.1\r\nConnection: Close\r\n\r\n", (0, "GET", "", False, False)),
        (b"GET /v1/check HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", (0, "GET", "", True, True)),
        (b"GET /v1/check HTTP/1.1\r\nContent-Length: 0\r\n\r\n", (0, "GET", "", True, False)),
        (b"GET /v1/check HTTP/1.1\r\nContent-Length: 00\r\n\r\n", False),
        (b"GET /v1/check HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", False),
        (b"GET /v1/check HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", False),
        (b"GET /v1/check HTTP/1.1\r\nUpgrade: websocket\r\n\r\n", False),
    ],
)
def test_parse_check(c, head, expect):
    r = same(c.parse_check, httphead.py_parse_check, head + b"rest")
    if expect is False:
        assert r is False
    else:
        rest, kind, method, target, query, keep, http10, h = r
        assert rest == b"rest"
        assert (kind, method, query, keep, http10) == expect


# -- generated and mutated heads ----------------------------------------------------------

ATOMS = [
    b"GET",
    b"HEAD",
    b"POST",
    b" ",
    b"/v1/check",
    b"/v1/authz",
    b"/x",
    b"?",
    b"=",
    b"&",
    b"HTTP/1.1",
    b"HTTP/1.0",
    b"HTTP/1.2",
    b"\r\n",
    b"\r",
    b"\n",
    b":",
    b": ",
    b"\t",
    b"Host",
    b"host",
    b"Content-Length",
    b"content-length",
    b"Transfer-Encoding",
    b"Connection",
    b"close",
    b"keep-alive",
    b"Upgrade",
    b"0",
    b"1",
    b"X-A",
    b"\xe9",
    b"\x00",
    b"(",
    b"\r\n\r\n",
]


@st.composite
def heads(draw):
    if draw(st.booleans()):
        return b"".join(draw(st.lists(st.sampled_from(ATOMS), max_size=40)))
    buf = bytearray(VALID if draw(st.booleans()) else draw(st.sampled_from([x for x, _ in CASES])))
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.integers(0, 2))
        i = draw(st.integers(0, len(buf)))
        if op == 0:
            buf[i:i] = draw(st.sampled_from(ATOMS))
        elif op == 1 and buf:
            del buf[i : i + draw(st.integers(1, 4))]
        elif buf:
            buf[min(i, len(buf) - 1)] = draw(st.integers(0, 255))
    return bytes(buf)


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(heads())
def test_c_and_python_agree_on_generated_heads(c, buf):
    same(c.parse_request, httphead.py_parse_request, buf)
    same_with_fields(c, buf)
    same(c.parse_check, httphead.py_parse_check, buf)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_c_and_python_agree_on_any_bytes(c, buf):
    same(c.parse_request, httphead.py_parse_request, buf)
    same(c.parse_check, httphead.py_parse_check, buf)


def test_wrong_types(c):
    for fn in (c.parse_request, httphead.py_parse_request, c.parse_check, httphead.py_parse_check):
        with pytest.raises(TypeError):
            fn("GET / HTTP/1.1\r\n\r\n")


# -- the 200 ----------------------------------------------------------------------------


def _pair(c, rule, dec, conn):
    """Both formatters' outcomes, asserted equal, taken within one second (the Date)."""
    for _ in range(5):
        t0 = int(time.time())
        a, b = outcome(c.ok_response, rule, dec, conn), outcome(httphead.py_ok_response, rule, dec, conn)
        if int(time.time()) == t0:
            assert a == b, f"C {a!r} != Python {b!r} for {rule!r}, {dec!r}, {conn!r}"
            return a
    raise AssertionError("the clock kept crossing second boundaries")


@settings(max_examples=1500, deadline=None)
@given(
    limit=st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=True), st.booleans()),
    remaining=st.one_of(st.integers(-(2**70), 2**70), st.just(3.0)),
    reset=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(0, 10)),
    policy=st.one_of(st.text(max_size=30), st.just('"api";q=10;w=60')),
    sf_name=st.one_of(st.text(max_size=30), st.just('"api"')),
    conn=st.integers(-1, 3),
)
def test_ok_response_c_and_python_agree(c, limit, remaining, reset, policy, sf_name, conn):
    rule = SimpleNamespace(policy=policy, sf_name=sf_name)
    kind, answer = _pair(c, rule, SimpleNamespace(limit=limit, remaining=remaining, reset=reset), conn)
    if 0 <= conn <= 2:
        assert kind == "ok"  # bytes, or None for what it leaves to Python
    else:
        assert (kind, answer) == ("raise", ValueError)


def test_ok_response_bytes(c):
    rule = SimpleNamespace(policy='"api";q=10;w=60', sf_name='"api"')
    dec = SimpleNamespace(limit=10, remaining=7, reset=59.9999995)
    for conn, line in ((0, b""), (1, b"Connection: keep-alive\r\n"), (2, b"Connection: close\r\n")):
        out = _pair(c, rule, dec, conn)[1]
        head, _, date = out.partition(b"Date: ")
        assert head == (
            b"HTTP/1.1 200 OK\r\nX-RateLimit-Limit: 10\r\nX-RateLimit-Remaining: 7\r\n"
            b'RateLimit-Policy: "api";q=10;w=60\r\nRateLimit: "api";r=7;t=60\r\n'
            b"Content-Length: 0\r\n" + line + b"Server: netlimit\r\n"
        )
        assert date.endswith(b" GMT\r\n\r\n")
    # what it does not format: None from both (the caller formats in Python)
    assert _pair(c, rule, SimpleNamespace(limit=10.0, remaining=7, reset=1.0), 0) == ("ok", None)
    assert _pair(c, SimpleNamespace(policy="\u20ac", sf_name='"a"'), dec, 0) == ("ok", None)
    assert _pair(c, rule, SimpleNamespace(limit=10, remaining=7, reset=float("inf")), 0) == ("ok", None)
    long = SimpleNamespace(policy="p" * 5000, sf_name="s" * 5000)
    assert len(_pair(c, long, dec, 0)[1]) > 10000
    assert _pair(c, SimpleNamespace(), dec, 0) == ("raise", AttributeError)


def test_http_date(c):
    for _ in range(5):
        t0 = int(time.time())
        a, b = c.http_date(), httphead.py_http_date()
        if int(time.time()) == t0:
            break
    assert a == b == email.utils.formatdate(t0, usegmt=True)
