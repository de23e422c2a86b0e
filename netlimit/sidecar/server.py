"""Running the sidecar: its listeners, the gRPC door beside them, signals, and
a graceful stop."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from typing import TYPE_CHECKING, Any

from ..listen import format_hostport
from .app import Sidecar
from .auth import warn_exposed
from .endpoints import Endpoints
from .http11.connection import HttpConnection
from .http11.state import Limits
from .proxy import Origin, Proxy, UpstreamPool

if TYPE_CHECKING:  # grpc is the optional extra netlimit[grpc]: imported only for --grpc
    from ..rls.server import GrpcServer

log = logging.getLogger("netlimit.sidecar")

#: how long a stop waits for answers in flight (proxied streams can be long)
STOP_GRACE = 5.0


async def _listen(loop: asyncio.AbstractEventLoop, factory: Any, host: str, port: int, what: str) -> Any:
    try:
        return await loop.create_server(factory, host, port, reuse_address=True, backlog=1024)
    except OSError as exc:
        raise SystemExit(f"cannot listen on {format_hostport(host, port)} ({what}): {exc.strerror or exc}") from None


def _bound(server: Any, host: str) -> list[str]:
    """The addresses a listener is bound to (the one asked for when unknown)."""
    return [str(s.getsockname()[0]) for s in server.sockets] or [host]


def _shown(server: Any, host: str, port: int) -> str:
    a = server.sockets[0].getsockname() if server.sockets else (host, port)
    return format_hostport(a[0], a[1])


async def serve(
    sc: Sidecar,
    host: str,
    port: int,
    *,
    admin: tuple[str, int] | None = None,
    grpc: tuple[str, int] | None = None,
    limits: Limits | None = None,
    request_buffer: int = 1024 * 1024,
    upstream_timeout: float = 300.0,
    ready: asyncio.Future | None = None,
) -> None:
    """Run until SIGTERM / SIGINT; SIGHUP reloads the rules.

    Decision mode: the listener serves the decision and operator endpoints
    (``admin``, if given, serves them too).  Proxy mode: the listener proxies every
    path; the decision and operator endpoints are only on ``admin``."""
    limits = limits or Limits()
    loop = asyncio.get_running_loop()
    pool: UpstreamPool | None = None
    if sc.upstream is not None:
        pool = UpstreamPool(Origin(sc.upstream), connect_timeout=5.0, read_timeout=upstream_timeout)
        main: Any = Proxy(sc, pool, request_buffer=request_buffer)
    else:
        main = Endpoints(sc)
    await sc.start()
    servers: list[Any] = []
    gs: GrpcServer | None = None
    try:
        s = await _listen(loop, lambda: HttpConnection(sc.state, main, limits), host, port, "the sidecar")
        servers.append(s)
        mode = f"proxy to {sc.upstream}" if pool is not None else "decision and operator endpoints"
        rs = sc.limiter.rules
        log.info(
            "listening on http://%s (%s; domain%s %s, %d rules, store %s, on_store_failure %s; HTTP parser llhttp %s)",
            _shown(s, host, port),
            mode,
            "s" if len(rs.domains) > 1 else "",
            ", ".join(map(repr, rs.domains)) or repr(rs.domain),
            len(rs.all_rules),
            "memory" if sc.storage == "memory" else "redis",
            sc.limiter.on_store_failure,
            _llhttp_version(),
        )
        token = sc.admin_token is not None
        if pool is None:  # decision mode: this listener is the decision door (proxy mode: the public's)
            warn_exposed("decision listener", _shown(s, host, port), _bound(s, host), token)
        if admin is not None:
            endpoints = Endpoints(sc)
            a = await _listen(
                loop, lambda: HttpConnection(sc.admin_state, endpoints, limits), admin[0], admin[1], "admin"
            )
            servers.append(a)
            log.info("admin listener on http://%s (decision endpoints, /healthz, /metrics, /v1/rules, /v1/top)",
                     _shown(a, *admin))  # fmt: skip
            warn_exposed("admin listener", _shown(a, *admin), _bound(a, admin[0]), token)
        if grpc is not None:
            from ..rls.server import GrpcServer

            gs = GrpcServer(sc.limiter, grpc[0], grpc[1], front=sc.front)
            try:
                await gs.start()
            except OSError as exc:
                raise SystemExit(str(exc)) from None
            log.info(
                "gRPC listening on %s (envoy.service.ratelimit.v3.RateLimitService, grpc.health.v1.Health; domain %r)",
                gs.address,
                rs.domain,
            )
            warn_exposed("gRPC door", gs.address, [gs.host], token)
        sweeper = asyncio.create_task(_sweep(sc))
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        loop.add_signal_handler(signal.SIGHUP, sc.on_sighup)
        if ready is not None and not ready.done():
            ready.set_result([srv.sockets[0].getsockname()[1] for srv in servers])
        try:
            await stop.wait()
        finally:
            log.info("stopping")
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(sig)
            sweeper.cancel()
    finally:
        for srv in servers:
            srv.close()
        if gs is not None:
            await gs.stop()
        # finish what is in flight, STOP_GRACE seconds in all
        deadline = loop.time() + STOP_GRACE
        states = (sc.state, sc.admin_state)
        while any(c.task is not None or c.queue for st in states for c in st.conns) and loop.time() < deadline:
            await asyncio.sleep(0.05)
        for st in states:
            for conn in list(st.conns):
                if conn.closing:  # still flushing to a client that does not read
                    conn.abort()
                else:
                    conn.close()
        if pool is not None:
            pool.close()
        await sc.stop()


async def _sweep(sc: Sidecar) -> None:
    """Header, keep-alive and send timeouts, checked twice a second for every
    connection of both listeners."""
    while True:
        await asyncio.sleep(0.5)
        now = time.monotonic()
        for st in (sc.state, sc.admin_state):
            try:
                st.sweep(now)
            except Exception:  # the sweep must go on
                log.exception("connection sweep failed")


def _llhttp_version() -> str:
    import httptools

    return getattr(httptools, "__version__", "?")
