"""The decision fast path's direct 200 formatting (FastCheckProtocol._serve with
headers.rate_header_lines) must produce the very bytes of the general path
(rate_headers → Reply → _send), whatever the connection's HTTP version and
keep-alive, and however the requests arrive (one by one, pipelined, a byte at a
time)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from netlimit.http import app as app_mod
from netlimit.http.app import FastCheckProtocol, Sidecar
from netlimit.http.headers import rate_header_lines, rate_headers

CONFIG = """\
version: 1
http:
  domain: api
  actions:
    - [remote_address]
    - [path]
  descriptors:
    - key: remote_address
      rate_limit: {unit: hour, requests_per_unit: 1000, name: per-client}
      algorithm: token_bucket
    - key: path
      value: /tiny
      rate_limit: {unit: minute, requests_per_unit: 2}
      algorithm: fixed_window
"""


class FakeTransport:
    def __init__(self):
        self.out: list[bytes] = []
        self.closed = False

    def get_extra_info(self, name):
        return ("192.0.2.7", 40000) if name == "peername" else None

    def write(self, data: bytes) -> None:
        self.out.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self):
        pass

    def resume_reading(self):
        pass


@pytest.fixture()
def sidecar(tmp_path: Path):
    cfg = tmp_path / "n.yaml"
    cfg.write_text(CONFIG)
    return Sidecar(str(cfg))


def _no_handoff():
    raise AssertionError("the fast path handed the connection to aiohttp")


def _conn(sc):
    p = FastCheckProtocol(sc, _no_handoff)
    t = FakeTransport()
    p.connection_made(t)
    return p, t


def _general(sc, result, keep: bool, http10: bool) -> bytes:
    """What _send writes for the same decision."""
    p, t = _conn(sc)
    p.http10 = http10
    p._send(sc.decision_reply("check", result, 429), keep, False)
    return t.out[0]


@pytest.mark.parametrize("version,conn,keep", [
    ("HTTP/1.1", None, True), ("HTTP/1.1", "close", False), ("HTTP/1.0", "keep-alive", True),
    ("HTTP/1.0", None, False)])
def test_direct_200_equals_the_general_path(sidecar, monkeypatch, version, conn, keep):
    monkeypatch.setattr(app_mod, "_date_cache", [0, b"", ""])
    p, t = _conn(sidecar)
    head = f"GET /v1/check {version}\r\nHost: x\r\nX-Original-URI: /a\r\n"
    if conn:
        head += f"Connection: {conn}\r\n"
    lim = sidecar.limiter
    seen = []
    real = lim.check_nowait

    def recording(*a, **k):
        seen.append(real(*a, **k))
        return seen[-1]

    monkeypatch.setattr(lim, "check_nowait", recording)
    p.data_received((head + "\r\n").encode())
    assert len(t.out) == 1 and t.closed == (not keep)
    (result,) = seen
    assert t.out[0] == _general(sidecar, result, keep, version == "HTTP/1.0")
    assert rate_header_lines(result) == "".join(f"{k}: {v}\r\n" for k, v in rate_headers(result).items())


def test_rate_header_lines_of_a_denial(sidecar):
    descs, _ = sidecar.check_request("192.0.2.7", {"x-original-uri": "/tiny"}, "")
    lim = sidecar.limiter
    results = [lim.check_nowait(lim.rules.domain, descs) for _ in range(3)]
    assert not results[-1].allowed
    for r in results:
        assert rate_header_lines(r) == "".join(f"{k}: {v}\r\n" for k, v in rate_headers(r).items())
    assert "Retry-After: " in rate_header_lines(results[-1])


def test_pipelined_and_byte_by_byte_give_the_same_answers(sidecar):
    reqs = b"".join(f"GET /v1/check HTTP/1.1\r\nHost: x\r\nX-Original-URI: /p{i}\r\n\r\n".encode()
                    for i in range(5))
    p1, t1 = _conn(sidecar)
    p1.data_received(reqs)                 # five requests in one read
    p2, t2 = _conn(sidecar)
    for i in range(len(reqs)):              # the same, a byte per read
        p2.data_received(reqs[i:i + 1])

    def norm(out):
        return [b.split(b"Date: ")[0] for b in out]

    assert len(t1.out) == len(t2.out) == 5
    # same shapes; the remaining counts go on from one connection to the other
    rem1 = [int(b.split(b"X-RateLimit-Remaining: ")[1].split(b"\r\n")[0]) for b in t1.out]
    rem2 = [int(b.split(b"X-RateLimit-Remaining: ")[1].split(b"\r\n")[0]) for b in t2.out]
    assert rem1 == [999, 998, 997, 996, 995] and rem2 == [994, 993, 992, 991, 990]
    assert all(b.startswith(b"HTTP/1.1 200 OK\r\n") and b.endswith(b" GMT\r\n\r\n") for b in t1.out + t2.out)
    assert all(x.endswith(b"Content-Length: 0\r\nServer: netlimit\r\n") for x in norm(t1.out + t2.out))


def test_bad_request_is_400_and_unknown_goes_to_aiohttp(sidecar):
    p, t = _conn(sidecar)
    p.data_received(b"GET /v1/check?deny_status=200 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert t.out[0].startswith(b"HTTP/1.1 400 Bad Request\r\n")
    # a request the fast path does not serve: the connection goes to aiohttp with the bytes
    seen = []

    class FakeAio:
        def connection_made(self, tr):
            seen.append("made")

        def data_received(self, data):
            seen.append(data)

    class T2(FakeTransport):
        def set_protocol(self, proto):
            seen.append("set")

    p2 = FastCheckProtocol(sidecar, FakeAio)
    t2 = T2()
    p2.connection_made(t2)
    p2.data_received(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert seen == ["made", "set", b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"]


def test_no_running_loop_needed_for_sync_answers(sidecar):
    # the fast path answers from data_received without scheduling anything
    p, t = _conn(sidecar)
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()
    p.data_received(b"GET /v1/authz/x HTTP/1.1\r\nHost: x\r\n\r\n")
    assert t.out[0].startswith(b"HTTP/1.1 200 OK\r\n")
