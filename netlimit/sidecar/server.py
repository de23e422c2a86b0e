"""Running the sidecar: the listener (fast path, aiohttp behind it), signals,
the gRPC door beside it, and a graceful stop."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

from aiohttp import web

from ..rls.server import GrpcServer
from . import httphead
from .app import FastCheckProtocol, Sidecar
from .proxy import FastProxyProtocol

log = logging.getLogger("netlimit.sidecar")


async def serve(sidecar: Sidecar, host: str, port: int, *, fast_path: bool = True) -> None:
    """Run until SIGTERM / SIGINT; SIGHUP reloads the rules.

    Connections start on a fast path -- :class:`FastCheckProtocol` for the
    decision endpoints, :class:`.proxy.FastProxyProtocol` in proxy mode -- and
    aiohttp takes over a connection at its first request the fast path does not
    serve; with ``fast_path=False`` aiohttp serves everything."""
    await sidecar.start()  # the upstream session exists before the first request
    aio = web.Server(sidecar.make_handler(), access_log=None)
    loop = asyncio.get_running_loop()
    fast = fast_path
    if fast and sidecar.upstream is not None:
        pool = sidecar.pool

        def factory() -> asyncio.Protocol:
            return FastProxyProtocol(sidecar, aio, pool)
    elif fast:

        def factory() -> asyncio.Protocol:
            return FastCheckProtocol(sidecar, aio)
    else:
        factory = aio
    try:
        listener = await loop.create_server(factory, host, port, reuse_address=True, backlog=1024)
    except OSError as exc:
        await sidecar.stop()
        raise SystemExit(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGHUP, sidecar.on_sighup)
    a = listener.sockets[0].getsockname() if listener.sockets else (host, port)
    shown = f"[{a[0]}]:{a[1]}" if ":" in a[0] else f"{a[0]}:{a[1]}"
    rs = sidecar.limiter.rules
    mode = f"proxy to {sidecar.upstream}" if sidecar.upstream is not None else "decision endpoint"
    store = "memory" if sidecar.storage == "memory" else "redis"
    log.info(
        "listening on http://%s (%s%s; domain %r, %d rules, store %s, on_store_failure %s)",
        shown,
        mode,
        ", fast path" if fast else "",
        rs.domain,
        len(rs.rules),
        store,
        sidecar.limiter.on_store_failure,
    )
    if fast:
        if httphead.IMPLEMENTATION == "c":
            log.info("HTTP head parser: netlimit's C module (netlimit/sidecar/_httphead.c)")
        else:
            log.warning(
                "HTTP head parser: the Python fallback (the C module was not built, or NETLIMIT_NO_EXTENSIONS "
                "is set): about 40%% more CPU per decision; reinstall with a C compiler to build it"
            )
    try:
        await stop.wait()
    finally:
        log.info("stopping")
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(s)
        listener.close()
        # finish what is in flight, 5 s in all (not per connection: proxied streams can be long)
        for _ in range(50):
            if not any(conn.busy for conn in sidecar.state.conns):
                break
            await asyncio.sleep(0.1)
        for conn in list(sidecar.state.conns):
            if conn.transport is not None:
                conn.transport.close()
        await aio.shutdown(5.0)
        await sidecar.stop()


async def serve_with_grpc(
    sidecar: Any, host: str, port: int, grpc_host: str, grpc_port: int, *, fast_path: bool = True
) -> None:
    """``app.serve`` plus the gRPC server on the same loop, sharing the sidecar's
    limiter (rules, reloads, store) and metrics.  The gRPC server stops before
    the sidecar closes its store."""
    gs = GrpcServer(sidecar.limiter, grpc_host, grpc_port, front=sidecar.front)
    try:
        await gs.start()
    except OSError as exc:
        await sidecar.limiter.close()
        raise SystemExit(str(exc)) from None
    rs = sidecar.limiter.rules
    log.info(
        "gRPC listening on %s (envoy.service.ratelimit.v3.RateLimitService, grpc.health.v1.Health; domain %r)",
        gs.address,
        rs.domain,
    )
    sidecar_stop = sidecar.stop

    async def stop() -> None:  # serve() calls sidecar.stop() on its way out
        await gs.stop()
        await sidecar_stop()

    sidecar.stop = stop
    try:
        await serve(sidecar, host, port, fast_path=fast_path)
    finally:
        sidecar.stop = sidecar_stop
        await gs.stop()
