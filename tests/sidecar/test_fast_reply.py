"""The decision fast path's direct 200 formatting (FastCheckProtocol._serve with
httphead.ok_response) must produce the very bytes of the general path
(rate_headers → Reply → _send), whatever the connection's HTTP version and
keep-alive, and however the requests arrive (one by one, pipelined, a byte at a
time) -- with the C helpers and with their Python twins."""

from __future__ import annotations

import asyncio
import email.utils
import re
from pathlib import Path

import pytest

from netlimit.sidecar import app as app_mod
from netlimit.sidecar import httphead
from netlimit.sidecar import protocol as protocol_mod
from netlimit.sidecar.app import FastCheckProtocol, Sidecar

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


@pytest.fixture(params=["c", "python"])
def impl(request, monkeypatch):
    """The fast path with the C helpers, then with their Python twins."""
    names = ("parse_check", "ok_response", "http_date")
    if request.param == "python":
        fns = {name: getattr(httphead, "py_" + name) for name in names}
    else:
        try:
            from netlimit.sidecar import _httphead
        except ImportError as e:
            pytest.fail(f"netlimit/sidecar/_httphead.c is not built ({e}); pip install -e . with a C compiler")
        fns = {name: getattr(_httphead, name) for name in names}
    for name, fn in fns.items():
        for mod in (app_mod, protocol_mod):
            if hasattr(mod, name):
                monkeypatch.setattr(mod, name, fn)
    return request.param


def _sidecar(tmp_path: Path, config: str) -> Sidecar:
    cfg = tmp_path / "n.yaml"
    cfg.write_text(config)
    return Sidecar(str(cfg))


@pytest.fixture()
def sidecar(impl, tmp_path: Path):
    return _sidecar(tmp_path, CONFIG)


def _record_check_fast(monkeypatch, lim) -> list:
    """What lim.check_fast returns from now on, in order."""
    seen: list = []
    real = lim.check_fast

    def recording(*a, **k):
        seen.append(real(*a, **k))
        return seen[-1]

    monkeypatch.setattr(lim, "check_fast", recording)
    return seen


def _split_date(b: bytes) -> tuple[bytes, bytes]:
    """(the response without its Date value, the Date value)."""
    head, _, rest = b.partition(b"Date: ")
    date, _, tail = rest.partition(b"\r\n")
    return head + b"Date: \r\n" + tail, date


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


@pytest.mark.parametrize(
    "version,conn,keep",
    [
        ("HTTP/1.1", None, True),
        ("HTTP/1.1", "close", False),
        ("HTTP/1.0", "keep-alive", True),
        ("HTTP/1.0", None, False),
    ],
)
def test_direct_200_equals_the_general_path(sidecar, monkeypatch, version, conn, keep):
    p, t = _conn(sidecar)
    head = f"GET /v1/check {version}\r\nHost: x\r\nX-Original-URI: /a\r\n"
    if conn:
        head += f"Connection: {conn}\r\n"
    lim = sidecar.limiter
    seen = _record_check_fast(monkeypatch, lim)
    p.data_received((head + "\r\n").encode())
    assert len(t.out) == 1 and t.closed == (not keep)
    (fast,) = seen  # two descriptors (address, path): a CheckResult
    general = _general(sidecar, fast, keep, version == "HTTP/1.0")
    (a, date_a), (b, date_b) = _split_date(t.out[0]), _split_date(general)
    assert a == b
    assert re.fullmatch(
        rb"(Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d\d (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) "
        rb"\d{4} \d\d:\d\d:\d\d GMT",
        date_a,
    )
    assert (
        abs(
            email.utils.parsedate_to_datetime(date_a.decode()).timestamp()
            - email.utils.parsedate_to_datetime(date_b.decode()).timestamp()
        )
        <= 1
    )


def test_one_descriptor_direct_200_equals_the_general_path(impl, tmp_path, monkeypatch):
    """check_fast's (rule, decision) answer (one descriptor) formats as the general path."""
    sc = _sidecar(tmp_path, CONFIG.replace("    - [path]\n", ""))
    seen = _record_check_fast(monkeypatch, sc.limiter)
    p, t = _conn(sc)
    p.data_received(b"GET /v1/check HTTP/1.1\r\nHost: x\r\n\r\n")
    (fast,) = seen
    assert fast.__class__ is tuple
    general = _general(sc, sc.limiter.as_result(*fast), True, False)
    assert _split_date(t.out[0])[0] == _split_date(general)[0]
    assert b"X-RateLimit-Remaining: 999\r\n" in t.out[0]


def test_what_ok_response_leaves_to_python_takes_the_general_path(sidecar, monkeypatch):
    """A decision ok_response does not format (here: a float limit) is answered by
    the general path with the same status and headers."""
    lim = sidecar.limiter
    real = lim.check_fast

    def floaty(*a, **k):
        r = real(*a, **k)
        d = r[1] if r.__class__ is tuple else r.report.decision
        d.limit = float(d.limit)
        return r

    monkeypatch.setattr(lim, "check_fast", floaty)
    p, t = _conn(sidecar)
    p.data_received(b"GET /v1/check HTTP/1.1\r\nHost: x\r\nX-Original-URI: /a\r\n\r\n")
    assert t.out[0].startswith(b"HTTP/1.1 200 OK\r\nX-RateLimit-Limit: 1000.0\r\n")
    assert sidecar.front.requests[("check", "ok")] == 1


def test_pipelined_and_byte_by_byte_give_the_same_answers(sidecar):
    reqs = b"".join(f"GET /v1/check HTTP/1.1\r\nHost: x\r\nX-Original-URI: /p{i}\r\n\r\n".encode() for i in range(5))
    p1, t1 = _conn(sidecar)
    p1.data_received(reqs)  # five requests in one read
    p2, t2 = _conn(sidecar)
    for i in range(len(reqs)):  # the same, a byte per read
        p2.data_received(reqs[i : i + 1])

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


def test_the_answers_of_one_loop_iteration_go_out_together_at_its_end(sidecar):
    """With a loop running, data_received writes nothing itself: the answers of
    the iteration (several connections, pipelined requests, a last answer that
    closes) are written back to back by Sidecar.flush_out once the iteration's
    callbacks are done, in order per connection.  A connection closed meanwhile
    gets nothing, and a transport whose write raises holds back no other."""
    ok = b"GET /v1/authz/x HTTP/1.1\r\nHost: x\r\n\r\n"
    bad = b"GET /v1/check?deny_status=200 HTTP/1.1\r\nHost: x\r\n\r\n"  # 400, the general path

    async def main():
        (p1, t1), (p2, t2), (p3, t3), (p4, t4) = [_conn(sidecar) for _ in range(4)]

        def boom(data):
            raise RuntimeError("transport gone")

        t4.write = boom
        p4.data_received(ok)
        p1.data_received(ok + bad)
        p2.data_received(ok.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
        p3.data_received(ok)
        t3.closed = True  # the client went away before the end of the iteration
        assert t1.out == t2.out == t3.out == [] and not t2.closed
        await asyncio.sleep(0)
        assert [o.split(b"\r\n", 1)[0] for o in t1.out] == [b"HTTP/1.1 200 OK", b"HTTP/1.1 400 Bad Request"]
        assert len(t2.out) == 1 and t2.out[0].startswith(b"HTTP/1.1 200 OK\r\n") and t2.closed
        assert t3.out == []
        # the next iteration starts a new batch
        assert not t1.closed
        p1.data_received(ok)
        assert len(t1.out) == 2
        await asyncio.sleep(0)
        assert len(t1.out) == 3 and t1.out[2].startswith(b"HTTP/1.1 200 OK\r\n")

    asyncio.run(main())


def test_answers_held_back_go_out_before_a_handoff_to_aiohttp(sidecar):
    """A pipelined request the fast path does not serve hands the connection to
    aiohttp; the answers to the requests before it, held back for the end of the
    iteration, are written first, so they cannot fall behind aiohttp's."""

    async def main():
        seen = []
        t = FakeTransport()

        class FakeAio:
            def connection_made(self, tr):
                pass

            def data_received(self, data):
                seen.append(list(t.out))

        t.set_protocol = lambda proto: None
        p = FastCheckProtocol(sidecar, FakeAio)
        p.connection_made(t)
        other, t2 = _conn(sidecar)
        other.data_received(b"GET /v1/authz/x HTTP/1.1\r\nHost: x\r\n\r\n")  # another connection's answer
        p.data_received(b"GET /v1/authz/x HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        (before,) = seen
        assert len(before) == 1 and before[0].startswith(b"HTTP/1.1 200 OK\r\n")
        assert len(t2.out) == 1  # the whole batch went out
        await asyncio.sleep(0)  # the scheduled flush finds nothing left
        assert len(t.out) == 1 and len(t2.out) == 1

    asyncio.run(main())
