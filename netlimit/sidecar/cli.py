"""`netlimit sidecar`: the L7 rate limiter as an HTTP service.

Only typer is imported at module level; httptools, redis and the rest load
when the command runs.
"""

from __future__ import annotations

from pathlib import Path

import typer


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
            help="Reverse-proxy mode: forward allowed requests to this base URL; the decision and operator "
            "endpoints then live only on --admin-listen.",
        ),
        admin_listen: str | None = typer.Option(
            None,
            "--admin-listen",
            show_default=False,
            help="HOST:PORT for the decision and operator endpoints (/v1/check, /v1/authz, /healthz, /metrics, "
            "/v1/rules, /v1/top) apart from the client-facing listener; proxy mode default 127.0.0.1:8182.",
        ),
        upstream_timeout: float = typer.Option(
            300.0,
            "--upstream-timeout",
            min=0.001,
            help="Proxy mode: seconds the upstream may stay silent once the request is sent (before its "
            "response head: 504; in the middle of a body: the client connection is aborted).",
        ),
        header_timeout: float = typer.Option(
            30.0, "--header-timeout", min=0.1, help="Seconds a whole request head may take to arrive (then 408)."
        ),
        body_timeout: float = typer.Option(
            60.0, "--body-timeout", min=0.1, help="Seconds a request body may stall between two reads (then 408)."
        ),
        keepalive_timeout: float = typer.Option(
            75.0, "--keepalive-timeout", min=0.1, help="Seconds an idle keep-alive connection is kept."
        ),
        send_timeout: float = typer.Option(
            60.0,
            "--send-timeout",
            min=0.1,
            help="Seconds a client may leave its answers unread (nothing sent to it) before the connection is aborted.",
        ),
        max_connections: int = typer.Option(
            10_000,
            "--max-connections",
            min=1,
            help="Client connections at most; at the cap the oldest idle one (else the slowest request head) is "
            "closed for a new one.",
        ),
        admin_max_connections: int = typer.Option(
            1024,
            "--admin-max-connections",
            min=1,
            help="Connections at most on --admin-listen, counted apart from the client-facing listener's.",
        ),
        request_buffer: int = typer.Option(
            1024 * 1024,
            "--request-buffer",
            min=0,
            help="Proxy mode: bytes of a request body read before the upstream request starts (a slow upload "
            "does not hold an upstream connection); longer bodies are streamed.",
        ),
        redis: str | None = typer.Option(
            None, "--redis", show_default=False, help="Redis URL; overrides http.storage."
        ),
        log_level: str = typer.Option(
            "info", "--log-level", envvar="NETLIMIT_LOG_LEVEL", help="debug | info | warning | error."
        ),
        log_format: str = typer.Option(
            "text",
            "--log-format",
            envvar="NETLIMIT_LOG_FORMAT",
            help="text (a level on every line; sd-daemon <N> prefixes under journald) | json (one object a line).",
        ),
        grpc: str | None = typer.Option(
            None,
            "--grpc",
            show_default=False,
            help="Also serve Envoy's rate limit gRPC API (envoy.service.ratelimit.v3, as envoyproxy/ratelimit) "
            "and grpc.health.v1 on HOST:PORT, on the same rules and store.",
        ),
        admin_token_file: Path | None = typer.Option(
            None,
            "--admin-token-file",
            show_default=False,
            help="A file holding a shared secret (one line, at least 16 characters): the decision, JSON and "
            "operator endpoints then answer 401 to requests without 'Authorization: Bearer <secret>' "
            '(nginx: proxy_set_header Authorization "Bearer ..."; Prometheus: authorization.credentials_file).',
        ),
        show_values: bool = typer.Option(
            False,
            "--show-values",
            help="Show the values of header: descriptors (API keys, tokens) in /v1/top and the logs; by default "
            "they are shown as sha256:<16 hex digits>.",
        ),
    ) -> None:
        """Run the HTTP rate-limit sidecar (decision endpoint, JSON API, or reverse proxy).

        Reloads the rules on SIGHUP and when the file changes; a bad file keeps
        the running rules. Exit 1 when the file is invalid at start.
        """
        from ..cli import EXIT_INVALID, EXIT_USAGE, err
        from ..logs import check, problem_fields, setup

        if problem := check(log_level, log_format):
            err(problem)
            raise typer.Exit(EXIT_USAGE)
        setup(log_level, fmt=log_format)
        import logging

        log = logging.getLogger("netlimit.sidecar")
        # from here on every line carries its level (and in JSON the fields)

        import asyncio

        from ..config.model import redis_url_problem
        from ..config.validate import ConfigError
        from ..extras import missing as missing_extra
        from ..listen import parse_listen
        from .app import Sidecar
        from .auth import load_token
        from .http11.state import Limits
        from .proxy import Origin
        from .server import serve

        try:
            host, port = parse_listen(listen)
            grpc_at = parse_listen(grpc, "--grpc") if grpc is not None else None
            if grpc_at is not None and (why := missing_extra("grpc")):
                raise ValueError(why)
            if admin_listen is None and upstream is not None:
                admin_listen = "127.0.0.1:8182"
            admin_at = parse_listen(admin_listen, "--admin-listen") if admin_listen is not None else None
            if upstream is not None:
                Origin(upstream)
            if redis is not None and (problem := redis_url_problem(redis)):
                raise ValueError(f"--redis {redis!r}: {problem}")
            token = load_token(str(admin_token_file)) if admin_token_file is not None else None
        except ValueError as exc:
            log.error(str(exc))
            raise typer.Exit(EXIT_USAGE) from None
        try:
            sc = Sidecar(
                str(config),
                upstream=upstream,
                redis_url=redis,
                max_connections=max_connections,
                admin_max_connections=admin_max_connections,
                admin_token=token,
                show_values=show_values,
            )
        except ConfigError as exc:
            for p in exc.problems:
                log.error(str(p), extra=problem_fields(p))
            n = len(exc.problems)
            log.error(f"{config}: {n} problem{'s' if n != 1 else ''}; the sidecar did not start")
            raise typer.Exit(EXIT_INVALID) from None
        limits = Limits(
            header_timeout=header_timeout,
            body_timeout=body_timeout,
            keepalive_timeout=keepalive_timeout,
            send_timeout=send_timeout,
        )
        try:
            import uvloop

            factory = uvloop.new_event_loop
        except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
            factory = None
        try:
            with asyncio.Runner(loop_factory=factory) as runner:
                runner.run(
                    serve(
                        sc,
                        host,
                        port,
                        admin=admin_at,
                        grpc=grpc_at,
                        limits=limits,
                        request_buffer=request_buffer,
                        upstream_timeout=upstream_timeout,
                    )
                )
        except SystemExit as exc:
            if isinstance(exc.code, str):
                log.error(exc.code)
                raise typer.Exit(EXIT_USAGE) from None
            raise
