"""Requests for bench/door_instructions.sh: N wrk-shaped ``GET /v1/check`` through
8 HttpConnections of the decision door on uvloop, one request per read as wrk
sends them, answers batched per loop iteration as the server does, a transport
that drops them (argv: RULES_FILE N).  ``STUB=handle`` answers with fixed bytes
(the connection layer alone), ``STUB=check`` gives Limiter.check_fast and check_keyed (the
connection's memoized descriptor) a fixed result (the door without the engine)."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import uvloop

from netlimit.sidecar import app, endpoints, responses
from netlimit.sidecar.http11.connection import HttpConnection
from netlimit.sidecar.http11.limits import Limits

REQ = b"GET /v1/check HTTP/1.1\r\nHost: 127.0.0.1:18900\r\nX-Original-URI: /\r\n\r\n"


class _Transport:
    def __init__(self) -> None:
        self.n = 0

    def get_extra_info(self, k: str) -> Any:
        return ("127.0.0.1", 1234) if k == "peername" else None

    def set_write_buffer_limits(self, *a: Any) -> None:
        pass

    def write(self, b: bytes) -> None:
        self.n += 1

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def close(self) -> None:
        pass


def main() -> None:
    sc = app.Sidecar(sys.argv[1])
    ep = endpoints.Endpoints(sc)
    stub = os.environ.get("STUB", "")
    if stub == "handle":
        fixed = responses.ok_decision(100, 99, 0.01, "100;w=1", "x", True, False)
        ep.handle = lambda conn, req: fixed  # type: ignore[method-assign]
    elif stub == "check":
        res = sc.limiter.check_fast([[("remote_address", "127.0.0.1")]])
        sc.limiter.check_fast = lambda d, cost=1, rs=None: res  # type: ignore[method-assign]
        sc.limiter.check_keyed = lambda rs, r, key, d: res  # type: ignore[method-assign]
    conns = []
    for _ in range(8):
        c = HttpConnection(sc.state, ep, Limits())
        t = _Transport()
        c.connection_made(t)
        conns.append((c, t))
    n = int(sys.argv[2])

    async def run() -> None:
        for _ in range(n // 8):
            for c, _t in conns:
                c.data_received(REQ)
            await asyncio.sleep(0)

    uvloop.run(run())
    assert sum(t.n for _c, t in conns) == n // 8 * 8


if __name__ == "__main__":
    main()
