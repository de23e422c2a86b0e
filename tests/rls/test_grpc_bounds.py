"""The gRPC door's bounds, hit on purpose through a real server on loopback:
more concurrent calls than it takes get RESOURCE_EXHAUSTED at once (never a
queue or a hang), an oversized message is refused, a connection that never
finishes its handshake and one that stays idle are closed."""

from __future__ import annotations

import asyncio
import socket
import time

import grpc
import pytest
from rls_helpers import OK, make_limiter, request, serving

pytestmark = pytest.mark.timeout(60)

CONFIG = """
version: 1
http:
  domain: api
  descriptors:
    - key: queue
      rate_limit: {unit: second, requests_per_unit: 4}
      algorithm: leaky_bucket
      burst: 100
      delay: true
    - key: remote_address
      rate_limit: {unit: second, requests_per_unit: 1000000}
"""


def run(coro):
    return asyncio.run(coro)


def test_calls_beyond_the_cap_are_refused_at_once_not_queued():
    """Queue mode holds each answer for its slot (4 per second): 30 calls at once
    against a cap of 8 -- the ones beyond the cap are RESOURCE_EXHAUSTED within a
    second, the others answer OK, nothing hangs; then the server takes calls again."""

    async def go():
        async with serving(make_limiter(CONFIG), max_rpcs=8) as s:
            results: list[tuple[str, float]] = []

            async def one(i: int) -> None:
                t0 = time.monotonic()
                try:
                    r = await s.stub.ShouldRateLimit(request("api", [("queue", "q")]), timeout=20)
                    results.append(("ok" if r.overall_code == OK else "over", time.monotonic() - t0))
                except grpc.aio.AioRpcError as exc:
                    results.append((exc.code().name, time.monotonic() - t0))

            await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(30))), 30)
            kinds = [k for k, _ in results]
            assert set(kinds) <= {"ok", "RESOURCE_EXHAUSTED"}, kinds
            assert kinds.count("RESOURCE_EXHAUSTED") >= 10, kinds
            assert 1 <= kinds.count("ok") <= 20
            assert all(t < 2 for k, t in results if k == "RESOURCE_EXHAUSTED")
            # the burst is over: the server answers again
            r = await s.call("api", [("remote_address", "a")])
            assert r.overall_code == OK

    run(go())


def test_an_oversized_message_is_refused():
    async def go():
        async with serving(make_limiter(CONFIG)) as s:
            big = request("api", [("remote_address", "x" * (100 * 1024))])
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await s.stub.ShouldRateLimit(big, timeout=10)
            assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert (await s.call("api", [("remote_address", "a")])).overall_code == OK

    run(go())


def _closed_within(port: int, send: bytes, limit: float) -> float | None:
    """Connect, send ``send``, read until the server closes; the seconds it took, or
    None if it did not close within ``limit``."""
    with socket.create_connection(("127.0.0.1", port), timeout=limit) as c:
        if send:
            c.sendall(send)
        t0 = time.monotonic()
        while time.monotonic() - t0 < limit:
            try:
                data = c.recv(65536)
            except TimeoutError:
                return None
            except ConnectionResetError:
                return time.monotonic() - t0
            if not data:
                return time.monotonic() - t0
    return None


def test_a_connection_that_never_finishes_its_handshake_is_closed():
    async def go():
        async with serving(make_limiter(CONFIG), handshake_ms=1000) as s:
            took = await asyncio.get_running_loop().run_in_executor(None, _closed_within, s.server.port, b"", 10)
            assert took is not None and took < 5, took

    run(go())


def test_an_idle_connection_is_closed():
    """The HTTP/2 preface and SETTINGS, then no call: GOAWAY and close after idle_ms."""
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"

    async def go():
        async with serving(make_limiter(CONFIG), idle_ms=1000, handshake_ms=10_000) as s:
            took = await asyncio.get_running_loop().run_in_executor(None, _closed_within, s.server.port, preface, 15)
            assert took is not None and took < 10, took

    run(go())
