"""The sidecar's gRPC front door: Envoy's rate limit service
(``envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit``, the protocol
of envoyproxy/ratelimit) and ``grpc.health.v1.Health``, on the same limiter
core, rules and store as the HTTP front doors.

* servicer.py  request → core → response (the mapping, overrides, errors)
* server.py    grpc.aio server start/stop, health (``netlimit sidecar --grpc``
               runs it beside the HTTP doors)
* proto/       the protocol: .proto files with Envoy's names and field
               numbers, the generated modules, and regen.py
"""

from .server import GrpcServer
from .servicer import RateLimitServicer

__all__ = ["GrpcServer", "RateLimitServicer"]
