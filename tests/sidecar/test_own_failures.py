"""The sidecar's own failures (a bug in a handler, not the client's doing): the
request gets one 500 and the connection closes; nothing escapes into asyncio
(which would log a traceback per request); the failure is counted and logged
at most once per interval, with where it happened and no traceback.

The connection class is driven by a real asyncio server on loopback and raw
sockets; the handler is a test double that fails on purpose (no user runs a
handler: the sidecar's own are tested everywhere else)."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest

from netlimit.sidecar.http11 import connection as http11
from netlimit.sidecar.http11.connection import HttpConnection
from netlimit.sidecar.http11.limits import Limits
from netlimit.sidecar.http11.state import ServerState

pytestmark = pytest.mark.timeout(60)


class Failing:
    wanted = frozenset({"host"})

    def __init__(self, mode: str):
        self.mode = mode
        self.bad = 0

    def bad_request(self) -> None:
        self.bad += 1

    def handle(self, conn, req):
        if req.path == "/ok":
            return b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
        if self.mode == "sync":
            raise KeyError("a bug in a handler")
        return self._later()

    async def _later(self) -> bytes:
        await asyncio.sleep(0)
        raise ZeroDivisionError("a bug after an await")


def _exchange(port: int, raw: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(raw)
        out = b""
        while True:
            data = s.recv(65536)
            if not data:
                return out
            out += data


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_failing_handler_answers_500_once_closes_and_logs_boundedly(mode, caplog):
    state = ServerState()
    handler = Failing(mode)
    escaped: list[dict] = []

    async def run() -> list[bytes]:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, ctx: escaped.append(ctx))
        server = await loop.create_server(lambda: HttpConnection(state, handler, Limits()), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            outs = []
            for _ in range(50):
                raw = b"GET /ok HTTP/1.1\r\nHost: a\r\n\r\nGET /boom HTTP/1.1\r\nHost: a\r\n\r\nGET /ok HTTP/1.1\r\nHost: a\r\n\r\n"
                outs.append(await loop.run_in_executor(None, _exchange, port, raw))
            return outs
        finally:
            server.close()
            await server.wait_closed()

    http11._bad_log = http11.LogEvery(10.0)  # a fresh interval for this test
    with caplog.at_level(logging.INFO, logger="netlimit.sidecar"):
        outs = asyncio.run(run())
    for out in outs:
        # the request before it answered, the failing one 500 (and the connection
        # closed: the one after it is never answered)
        assert out.count(b"HTTP/1.1 ") == 2
        assert out.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"HTTP/1.1 500 Internal Server Error\r\n" in out and b"Connection: close\r\n" in out
    assert escaped == []
    assert state.errors == 50 and handler.bad == 0  # the sidecar's failure, not a bad request
    lines = [r for r in caplog.records if r.name == "netlimit.sidecar"]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    msg = lines[0].getMessage()
    assert lines[0].exc_info is None and "Traceback" not in caplog.text
    assert ("KeyError" if mode == "sync" else "ZeroDivisionError") in msg
    assert "test_own_failures.py:" in msg  # where it happened
