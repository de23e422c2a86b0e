"""The gRPC server of the sidecar: Envoy's RateLimitService plus the standard
health service (``grpc.health.v1.Health``), on grpc.aio in the sidecar's own
event loop (the limiter core is single-threaded: one loop, no locks).

``netlimit sidecar --grpc HOST:PORT`` runs it beside the HTTP doors
(netlimit/sidecar/server.py); tests and the benchmark start it on its own.

Bounds: a request message is at most ``MAX_MESSAGE`` bytes (Envoy's are a few
hundred), a connection carries at most ``MAX_STREAMS`` calls at once, the
server at most ``max_rpcs`` calls in all (beyond: RESOURCE_EXHAUSTED at once,
never a queue), an answer is held at most ``max_delay`` seconds (leaky bucket
queue mode), a connection must finish its HTTP/2 handshake within
``handshake_ms`` and is closed after ``idle_ms`` without a call, and silent
peers are found by keepalive pings: slow or hostile clients cannot pile up.

Health: ``""`` and ``envoy.service.ratelimit.v3.RateLimitService`` are SERVING
while the server runs, NOT_SERVING once it stops (so a load balancer drains it
before the port closes).  A Redis outage does not make it unhealthy: decisions
go on through ``on_store_failure`` (the store's state is in /metrics and
/healthz).
"""

from __future__ import annotations

import logging
import socket
from typing import Any

import grpc
from grpc_health.v1 import _async as health_async
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ..limit.limiter import Limiter
from ..listen import format_hostport
from .proto import rls_pb2, rls_pb2_grpc
from .servicer import RateLimitServicer

log = logging.getLogger("netlimit.sidecar")

SERVICE_NAME = rls_pb2.DESCRIPTOR.services_by_name["RateLimitService"].full_name
#: Envoy's rate limit requests are a few hundred bytes; anything this large is not one
MAX_MESSAGE = 64 * 1024
#: concurrent calls per connection (Envoy multiplexes; one client cannot hold them all)
MAX_STREAMS = 100
#: concurrent calls in all (a decision takes microseconds; only queue mode holds one)
MAX_RPCS = 1024
#: a connection's HTTP/2 handshake, and its life without a call
HANDSHAKE_MS = 10_000
IDLE_MS = 300_000


class GrpcServer:
    """RateLimitService + Health on ``host:port`` (port 0: any free port, see
    :attr:`port` after :meth:`start`)."""

    def __init__(
        self,
        limiter: Limiter,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        front: Any = None,
        max_delay: float = 60.0,
        max_rpcs: int = MAX_RPCS,
        idle_ms: int = IDLE_MS,
        handshake_ms: int = HANDSHAKE_MS,
        reuse_port: bool = False,
    ):
        self.host = host
        self.max_rpcs = max_rpcs
        self.idle_ms = idle_ms
        self.handshake_ms = handshake_ms
        self.reuse_port = reuse_port  # the workers of `sidecar --workers N` share the port
        self.requested_port = port
        self.port = 0
        self.servicer = RateLimitServicer(limiter, front, max_delay=max_delay)
        self.health = health_async.HealthServicer()
        self._server: grpc.aio.Server | None = None
        self._v6_hold: socket.socket | None = None  # see _add_port

    @property
    def address(self) -> str:
        return format_hostport(self.host, self.port)

    async def start(self) -> int:
        server = grpc.aio.server(
            maximum_concurrent_rpcs=self.max_rpcs,
            options=[
                # a second sidecar on the same port must fail, not share it (but a worker's siblings share it)
                ("grpc.so_reuseport", 1 if self.reuse_port else 0),
                ("grpc.max_receive_message_length", MAX_MESSAGE),
                ("grpc.max_send_message_length", 4 * MAX_MESSAGE),
                ("grpc.max_concurrent_streams", MAX_STREAMS),
                ("grpc.server_handshake_timeout_ms", self.handshake_ms),
                ("grpc.max_connection_idle_ms", self.idle_ms),
                ("grpc.keepalive_time_ms", 60_000),
                ("grpc.keepalive_timeout_ms", 20_000),
                ("grpc.http2.max_ping_strikes", 2),
                ("grpc.max_metadata_size", 16 * 1024),
            ],
        )
        rls_pb2_grpc.add_RateLimitServiceServicer_to_server(self.servicer, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        self.port = self._add_port(server)
        await server.start()
        self._server = server
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        return self.port

    def _add_port(self, server: grpc.aio.Server) -> int:
        """Bind ``host:port``.  gRPC core takes ``0.0.0.0`` for "every address" and binds
        ``[::]`` dual-stack, so it would answer on IPv6 (``::1``) too, unlike the HTTP
        listeners; a socket of our own holding ``[::]:port`` (IPv6 only, bound, never
        listening, no SO_REUSEADDR) makes that bind fail, and gRPC falls back to
        ``0.0.0.0`` alone (its documented path for hosts without IPv6).  A connection
        to ``[::1]:port`` is then refused.  Port 0: the IPv6 hold picks the port,
        retried when IPv4 has it taken."""
        for _ in range(8 if self.host == "0.0.0.0" and self.requested_port == 0 else 1):
            hold = _hold_ipv6(self.requested_port) if self.host == "0.0.0.0" else None
            port_asked = hold.getsockname()[1] if hold is not None else self.requested_port
            target = format_hostport(self.host, port_asked)
            try:
                port = server.add_insecure_port(target)
            except RuntimeError as exc:  # grpcio raises on a failed bind
                port, err = 0, str(exc)
            else:
                err = "the address is in use or not available"  # older grpcio report a failed bind as port 0
            if port:
                self._v6_hold = hold
                return port
            if hold is not None:
                hold.close()
        raise OSError(f"cannot listen for gRPC on {target}: {err}")

    async def stop(self, grace: float = 5.0) -> None:
        """NOT_SERVING, then finish in-flight calls (at most ``grace`` seconds)."""
        server, self._server = self._server, None
        if server is None:
            return
        try:
            await self.health.enter_graceful_shutdown()
        except Exception:  # a failing health service must not keep the server from stopping
            pass
        await server.stop(grace)
        if self._v6_hold is not None:
            self._v6_hold.close()
            self._v6_hold = None


def _hold_ipv6(port: int) -> socket.socket | None:
    """An IPv6-only socket bound to ``[::]:port`` and never listening (None where the
    host has no IPv6 or another socket holds that port already: gRPC then cannot take
    ``[::]`` either)."""
    try:
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    except OSError:
        return None
    try:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        s.bind(("::", port))
    except OSError:
        s.close()
        return None
    return s
