"""The decision endpoint keeps a keep-alive connection's descriptor, its rule and
its store key (endpoints.py ``_remember``) when the actions read nothing but the
TCP peer: every answer on such a connection must be the one a fresh connection
gets -- the same limit, the same 429 at the same request, the same counters --
and a reload, a query or an X-Forwarded-For must still be seen.

The connection is driven in process (``data_received`` with a transport that
keeps what it is given), request by request as a keep-alive client sends them."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from netlimit.sidecar.app import Sidecar
from netlimit.sidecar.endpoints import Endpoints
from netlimit.sidecar.http11.connection import HttpConnection
from netlimit.sidecar.http11.limits import Limits

pytestmark = pytest.mark.timeout(60)

RULES = """\
version: 1
http:
  domain: memo
  actions:
    - [remote_address]
  descriptors:
    - key: remote_address
      rate_limit: {{unit: hour, requests_per_unit: {n}}}
"""
REQ = b"GET /v1/check%s HTTP/1.1\r\nHost: a\r\nX-Original-URI: /%s\r\n\r\n"


class _Transport:
    def __init__(self, peer: str) -> None:
        self.peer = peer
        self.out: list[bytes] = []

    def get_extra_info(self, k: str) -> Any:
        return (self.peer, 1234) if k == "peername" else None

    def set_write_buffer_limits(self, *a: Any) -> None:
        pass

    def write(self, b: bytes) -> None:
        self.out.append(b)

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def close(self) -> None:
        pass


def _sidecar(tmp_path: Path, n: int) -> tuple[Sidecar, Path]:
    cfg = tmp_path / "n.yaml"
    cfg.write_text(RULES.format(n=n))
    return Sidecar(str(cfg)), cfg


def _conn(sc: Sidecar, peer: str = "198.51.100.7") -> tuple[HttpConnection, _Transport]:
    conn = HttpConnection(sc.state, Endpoints(sc), Limits())
    t = _Transport(peer)
    conn.connection_made(t)
    return conn, t


def _ask(conn: HttpConnection, t: _Transport, query: str = "", extra: bytes = b"") -> tuple[int, dict[str, str]]:
    raw = REQ % (query.encode(), b"")
    if extra:
        raw = raw[:-2] + extra + b"\r\n"
    conn.data_received(raw)
    out = t.out.pop()
    head = out.split(b"\r\n\r\n", 1)[0].decode()
    lines = head.split("\r\n")
    fields = {k.lower(): v for k, _, v in (ln.partition(": ") for ln in lines[1:])}
    fields.pop("date")
    return int(lines[0].split()[1]), fields


def test_a_kept_connection_answers_as_fresh_connections_do(tmp_path):
    """Five requests on one connection and five on five connections (two
    sidecars, the same rules): the same statuses and headers, request by
    request, the 429 at the same place, the same counters."""
    kept_sc, _ = _sidecar(tmp_path, 3)
    fresh_sc, _ = _sidecar(tmp_path, 3)
    conn, t = _conn(kept_sc)
    kept = [_ask(conn, t) for _ in range(5)]
    fresh = [_ask(*_conn(fresh_sc)) for _ in range(5)]
    assert [s for s, _ in kept] == [200, 200, 200, 429, 429]
    assert conn.memo is not None  # the connection did keep its descriptor
    for (s1, h1), (s2, h2) in zip(kept, fresh):
        assert s1 == s2
        h1.pop("retry-after", None), h2.pop("retry-after", None)  # seconds left: may tick between the two
        assert {k: v for k, v in h1.items() if k != "ratelimit"} == {k: v for k, v in h2.items() if k != "ratelimit"}
    (r1,), (r2,) = kept_sc.limiter.rules.all_rules, fresh_sc.limiter.rules.all_rules
    assert (
        (r1.stats.hits, r1.stats.within, r1.stats.over) == (r2.stats.hits, r2.stats.within, r2.stats.over) == (5, 3, 2)
    )
    assert kept_sc.front.requests == fresh_sc.front.requests
    assert kept_sc.limiter.stats.latency.count == fresh_sc.limiter.stats.latency.count == 5


def test_a_reload_reaches_a_kept_connection(tmp_path):
    """The memo names the plan and the rules it was made under: a reload that
    raises the limit applies to the next request of the same connection."""
    sc, cfg = _sidecar(tmp_path, 1)
    conn, t = _conn(sc)
    assert [_ask(conn, t)[0] for _ in range(2)] == [200, 429]
    cfg.write_text(RULES.format(n=100))
    assert sc.reload("test")
    status, fields = _ask(conn, t)
    assert status == 200
    assert fields["x-ratelimit-limit"] == "100"


def test_a_query_and_a_forwarded_for_are_still_read(tmp_path, caplog):
    """deny_status in the query still changes the status; an X-Forwarded-For from
    an untrusted peer is still reported (once) on a connection that kept its
    descriptor, and never becomes the key."""
    sc, _ = _sidecar(tmp_path, 1)
    conn, t = _conn(sc)
    assert _ask(conn, t)[0] == 200
    assert _ask(conn, t, "?deny_status=403")[0] == 403
    with caplog.at_level(logging.WARNING, logger="netlimit.sidecar"):
        status, _ = _ask(conn, t, extra=b"X-Forwarded-For: 203.0.113.9\r\n")
    assert status == 429  # still the peer's key: the header is not believed
    assert any("X-Forwarded-For" in r.getMessage() for r in caplog.records)
    other, t2 = _conn(sc, "192.0.2.1")  # another peer: its own key
    assert _ask(other, t2)[0] == 200
