"""`netlimit sidecar`: the L7 rate limiter as an HTTP service.

Only typer is imported at module level; aiohttp, redis and the rest load
when the command runs.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import typer


def _setup_logging(level: str) -> None:
    # journald adds its own timestamps (and sets JOURNAL_STREAM); elsewhere add them.
    fmt = "%(levelname)s %(message)s" if os.environ.get("JOURNAL_STREAM") else "%(asctime)s %(levelname)s %(message)s"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(fmt))
    root = logging.getLogger("netlimit")
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper()))
    root.propagate = False
    aio = logging.getLogger("aiohttp")
    aio.handlers[:] = [handler]
    aio.setLevel(logging.WARNING)
    aio.propagate = False


def register(app: typer.Typer) -> None:
    @app.command()
    def sidecar(
        config: Path = typer.Option(
            ..., "--config", "-c", help="The netlimit YAML file (its http: section).", show_default=False
        ),
        listen: str = typer.Option(
            "127.0.0.1:8181", "--listen", "-l", help="HOST:PORT or [IPv6]:PORT to serve on (port 0 = any free port)."
        ),
        upstream: str | None = typer.Option(
            None,
            "--upstream",
            "-u",
            show_default=False,
            help="Reverse-proxy mode: forward allowed requests to this base URL "
            "(own endpoints then live under /_netlimit/).",
        ),
        upstream_timeout: float = typer.Option(
            300.0,
            "--upstream-timeout",
            min=0.001,
            help="Proxy mode: seconds the upstream may stay silent (before its response head: 504; "
            "in the middle of a body: the client connection is aborted).",
        ),
        redis: str | None = typer.Option(
            None, "--redis", show_default=False, help="Redis URL; overrides http.storage."
        ),
        log_level: str = typer.Option("info", "--log-level", help="debug | info | warning | error."),
        fast_path: bool = typer.Option(
            True,
            "--fast-path/--no-fast-path",
            help="Answer bodiless /v1/check and /v1/authz requests, and in proxy mode forward plain "
            "HTTP/1.1 requests over pooled upstream connections, with lean asyncio protocols "
            "(aiohttp serves everything else); --no-fast-path leaves all to aiohttp.",
        ),
        grpc: str | None = typer.Option(
            None,
            "--grpc",
            show_default=False,
            help="Also serve Envoy's rate limit gRPC API (envoy.service.ratelimit.v3, as envoyproxy/ratelimit) "
            "and grpc.health.v1 on HOST:PORT, on the same rules and store.",
        ),
    ) -> None:
        """Run the HTTP rate-limit sidecar (decision endpoint, JSON API, or reverse proxy).

        Reloads the rules on SIGHUP and when the file changes; a bad file keeps
        the running rules. Exit 1 when the file is invalid at start.
        """
        from ..cli import EXIT_INVALID, EXIT_USAGE, err

        if log_level.lower() not in ("debug", "info", "warning", "error"):
            err(f"--log-level {log_level!r}: expected debug, info, warning or error")
            raise typer.Exit(EXIT_USAGE)
        _setup_logging(log_level)

        import asyncio

        from ..config.validate import ConfigError
        from ..listen import parse_listen
        from .app import Sidecar
        from .server import serve

        try:
            host, port = parse_listen(listen)
            if grpc is not None:
                grpc_host, grpc_port = parse_listen(grpc, "--grpc")
        except ValueError as exc:
            err(str(exc))
            raise typer.Exit(EXIT_USAGE) from None
        if upstream is not None and not upstream.startswith(("http://", "https://")):
            err(f"--upstream {upstream!r}: expected a URL like http://127.0.0.1:8080")
            raise typer.Exit(EXIT_USAGE)
        if redis is not None and not redis.startswith(("redis://", "rediss://", "unix://")):
            err(f"--redis {redis!r}: expected a URL like redis://127.0.0.1:6379/0")
            raise typer.Exit(EXIT_USAGE)
        try:
            sc = Sidecar(str(config), upstream=upstream, redis_url=redis, upstream_timeout=upstream_timeout)
        except ConfigError as exc:
            for p in exc.problems:
                err(str(p))
            n = len(exc.problems)
            err(f"{config}: {n} problem{'s' if n != 1 else ''}; the sidecar did not start")
            raise typer.Exit(EXIT_INVALID) from None

        try:
            import uvloop

            factory = uvloop.new_event_loop
        except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
            factory = None
        try:
            with asyncio.Runner(loop_factory=factory) as runner:
                if grpc is not None:
                    from .server import serve_with_grpc

                    runner.run(serve_with_grpc(sc, host, port, grpc_host, grpc_port, fast_path=fast_path))
                else:
                    runner.run(serve(sc, host, port, fast_path=fast_path))
        except SystemExit as exc:
            if isinstance(exc.code, str):
                err(exc.code)
                raise typer.Exit(EXIT_USAGE) from None
            raise
