"""Running the sidecar: its listeners, the gRPC door beside them, signals, and
a graceful stop."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..compiled import running as compiled_modules
from ..config.model import redis_url_problem
from ..errors import NetlimitError
from ..extras import missing as missing_extra
from ..listen import format_hostport, parse_listen
from .app import Sidecar
from .auth import load_token, warn_exposed
from .endpoints import Endpoints
from .http11.connection import HttpConnection
from .http11.limits import Limits
from .proxy import Origin, Proxy, UpstreamPool

if TYPE_CHECKING:  # grpc is the optional extra netlimit[grpc]: imported only for --grpc
    from ..rls.server import GrpcServer

log = logging.getLogger("netlimit.sidecar")

#: how long a stop waits for answers in flight (proxied streams can be long)
STOP_GRACE = 5.0


async def _listen(
    loop: asyncio.AbstractEventLoop, factory: Any, host: str, port: int, what: str, reuse_port: bool = False
) -> Any:
    try:
        return await loop.create_server(factory, host, port, reuse_address=True, reuse_port=reuse_port or None,
                                        backlog=1024)  # fmt: skip
    except OSError as exc:
        raise SystemExit(f"cannot listen on {format_hostport(host, port)} ({what}): {exc.strerror or exc}") from None


def _bound(server: Any, host: str) -> list[str]:
    """The addresses a listener is bound to (the one asked for when unknown)."""
    return [str(s.getsockname()[0]) for s in server.sockets] or [host]


def _shown(server: Any, host: str, port: int) -> str:
    a = server.sockets[0].getsockname() if server.sockets else (host, port)
    return format_hostport(a[0], a[1])


class UsageError(NetlimitError, ValueError):
    """A flag the sidecar cannot start with (exit 64)."""


@dataclass
class Options:
    """What `netlimit sidecar` was asked (sidecar/cli.py holds the flags and their help)."""

    config: str
    listen: str = "127.0.0.1:8181"
    upstream: str | None = None
    admin_listen: str | None = None
    upstream_timeout: float = 300.0
    header_timeout: float = 30.0
    body_timeout: float = 60.0
    keepalive_timeout: float = 75.0
    send_timeout: float = 60.0
    max_connections: int = 10_000
    admin_max_connections: int = 1024
    request_buffer: int = 1024 * 1024
    redis: str | None = None
    grpc: str | None = None
    admin_token_file: str | None = None
    show_values: bool = False
    #: --workers: N > 1 runs a supervisor and N workers (workers.py); 1 is this one process
    workers: int = 1
    #: set by the supervisor in a worker: its index (its listeners then bind with SO_REUSEPORT)
    worker: int | None = None
    #: a worker's memory store: the state owner's Unix socket (stores/shared.py)
    shared_state: str | None = None
    #: leases from the state owner for hot keys (off: one round trip per decision)
    shared_leases: bool = True
    #: set by the supervisor in a worker: the 0700 directory of the workers' sockets (peers.py)
    peer_dir: str | None = None
    log_level: str = "info"
    log_format: str = "text"


def run(o: Options) -> None:
    """Start the sidecar the options describe and serve until SIGTERM / SIGINT.
    :class:`UsageError` for a bad flag, ConfigError for a bad file (nothing
    started), SystemExit(message) when a listener or the store cannot start."""
    try:
        host, port = parse_listen(o.listen)
        grpc_at = parse_listen(o.grpc, "--grpc") if o.grpc is not None else None
        if grpc_at is not None and (why := missing_extra("grpc")):
            raise ValueError(why)
        admin_listen = o.admin_listen
        if admin_listen is None and o.upstream is not None:
            admin_listen = "127.0.0.1:8182"
        admin_at = parse_listen(admin_listen, "--admin-listen") if admin_listen is not None else None
        if o.upstream is not None:
            Origin(o.upstream)
        if o.redis is not None and (problem := redis_url_problem(o.redis)):
            raise ValueError(f"--redis {o.redis!r}: {problem}")
        token = load_token(o.admin_token_file) if o.admin_token_file is not None else None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if o.workers != 1 and o.worker is None:
        from .workers import supervise

        return supervise(o)
    sc = Sidecar(
        o.config,
        upstream=o.upstream,
        redis_url=o.redis,
        max_connections=o.max_connections,
        admin_max_connections=o.admin_max_connections,
        admin_token=token,
        show_values=o.show_values,
        shared_state=o.shared_state,
        shared_leases=o.shared_leases,
    )  # ConfigError to the caller
    if o.worker is not None:
        sc.worker = (o.worker, o.workers)
        if o.peer_dir is not None and o.workers > 1:
            from .peers import Peers

            sc.peers = Peers(o.peer_dir, o.worker, o.workers)
    limits = Limits(
        header_timeout=o.header_timeout,
        body_timeout=o.body_timeout,
        keepalive_timeout=o.keepalive_timeout,
        send_timeout=o.send_timeout,
    )
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(
            serve(
                sc,
                host,
                port,
                admin=admin_at,
                grpc=grpc_at,
                limits=limits,
                request_buffer=o.request_buffer,
                upstream_timeout=o.upstream_timeout,
                reuse_port=o.worker is not None,
            )
        )


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
    reuse_port: bool = False,
) -> None:
    """Run until SIGTERM / SIGINT; SIGHUP reloads the rules.

    Decision mode: the listener serves the decision and operator endpoints
    (``admin``, if given, serves them too).  Proxy mode: the listener proxies every
    path; the decision and operator endpoints are only on ``admin``."""
    limits = limits or Limits()
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
        if sc.peers is not None:
            await sc.peers.start(sc)
        servers.append(await _main_listener(sc, main, limits, host, port, proxy=pool is not None, rp=reuse_port))
        if admin is not None:
            servers.append(await _admin_listener(sc, limits, admin, rp=reuse_port))
        if grpc is not None:
            gs = await _grpc_door(sc, grpc, rp=reuse_port)
        await _until_stopped(sc, [srv.sockets[0].getsockname()[1] for srv in servers], ready)
    finally:
        for srv in servers:
            srv.close()
        if sc.peers is not None:
            sc.peers.close()
        if gs is not None:
            await gs.stop()
        await _finish(sc)
        if pool is not None:
            pool.close()
        await sc.stop()


async def _main_listener(
    sc: Sidecar, handler: Any, limits: Limits, host: str, port: int, *, proxy: bool, rp: bool = False
) -> Any:
    """The client-facing listener (decision mode: the decision door too)."""
    loop = asyncio.get_running_loop()
    s = await _listen(loop, lambda: HttpConnection(sc.state, handler, limits), host, port, "the sidecar", rp)
    mode = f"proxy to {sc.upstream}" if proxy else "decision and operator endpoints"
    rs = sc.limiter.rules
    log.info(
        "listening on http://%s (%s; domain%s %s, %d rules, store %s, on_store_failure %s; "
        "HTTP parser llhttp %s; door %s)",
        _shown(s, host, port),
        mode,
        "s" if len(rs.domains) > 1 else "",
        ", ".join(map(repr, rs.domains)) or repr(rs.domain),
        len(rs.all_rules),
        "memory" if sc.storage == "memory" else "redis",
        sc.limiter.on_store_failure,
        _llhttp_version(),
        "compiled (mypyc)" if compiled_modules() else "in Python (not compiled: netlimit/compiled.py)",
    )
    if not proxy:  # decision mode: this listener is the decision door (proxy mode: the public's)
        warn_exposed("decision listener", _shown(s, host, port), _bound(s, host), sc.admin_token is not None)
    return s


async def _admin_listener(sc: Sidecar, limits: Limits, admin: tuple[str, int], rp: bool = False) -> Any:
    loop = asyncio.get_running_loop()
    endpoints = Endpoints(sc)
    conn = lambda: HttpConnection(sc.admin_state, endpoints, limits)  # noqa: E731
    a = await _listen(loop, conn, admin[0], admin[1], "admin", rp)
    log.info("admin listener on http://%s (decision endpoints, /healthz, /metrics, /v1/rules, /v1/top)",
             _shown(a, *admin))  # fmt: skip
    warn_exposed("admin listener", _shown(a, *admin), _bound(a, admin[0]), sc.admin_token is not None)
    return a


async def _grpc_door(sc: Sidecar, grpc: tuple[str, int], rp: bool = False) -> GrpcServer:
    from ..rls.server import GrpcServer

    gs = GrpcServer(sc.limiter, grpc[0], grpc[1], front=sc.front, reuse_port=rp)
    try:
        await gs.start()
    except OSError as exc:
        raise SystemExit(str(exc)) from None
    log.info(
        "gRPC listening on %s (envoy.service.ratelimit.v3.RateLimitService, grpc.health.v1.Health; domain %r)",
        gs.address,
        sc.limiter.rules.domain,
    )
    warn_exposed("gRPC door", gs.address, [gs.host], sc.admin_token is not None)
    return gs


async def _until_stopped(sc: Sidecar, ports: list[int], ready: asyncio.Future | None) -> None:
    """Sweep the connections, reload on SIGHUP, return on SIGTERM / SIGINT."""
    loop = asyncio.get_running_loop()
    sweeper = asyncio.create_task(_sweep(sc))
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGHUP, sc.on_sighup)
    if ready is not None and not ready.done():
        ready.set_result(ports)
    try:
        await stop.wait()
    finally:
        log.info("stopping")
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        sweeper.cancel()


async def _finish(sc: Sidecar) -> None:
    """Let what is in flight finish (STOP_GRACE seconds in all), then close every connection."""
    loop = asyncio.get_running_loop()
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
