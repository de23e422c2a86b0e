"""`netlimit sidecar`: the L7 rate limiter as an HTTP service.

Only typer is imported at module level; httptools, redis and the rest load
when the command runs.  The command parses its flags and the log settings;
what it drives (the config, the listeners, the event loop) is started by
:func:`netlimit.sidecar.server.run`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

# the flags, each with its help (the command's signature names them)
_Config = Annotated[
    Path,
    typer.Option(
        "--config",
        "-c",
        help="The netlimit YAML file (its http: section).",
        show_default=False,
    ),
]
_Listen = Annotated[
    str,
    typer.Option(
        "--listen",
        "-l",
        help="HOST:PORT or [IPv6]:PORT to serve on (port 0 = any free port).",
    ),
]
_Upstream = Annotated[
    str | None,
    typer.Option(
        "--upstream",
        "-u",
        show_default=False,
        help="Reverse-proxy mode: forward allowed requests to this base URL; the decision and operator "
        "endpoints then live only on --admin-listen.",
    ),
]
_AdminListen = Annotated[
    str | None,
    typer.Option(
        "--admin-listen",
        show_default=False,
        help="HOST:PORT for the decision and operator endpoints (/v1/check, /v1/authz, /healthz, /metrics, "
        "/v1/rules, /v1/top) apart from the client-facing listener; proxy mode default 127.0.0.1:8182.",
    ),
]
_UpstreamTimeout = Annotated[
    float,
    typer.Option(
        "--upstream-timeout",
        min=0.001,
        help="Proxy mode: seconds the upstream may stay silent once the request is sent (before its "
        "response head: 504; in the middle of a body: the client connection is aborted).",
    ),
]
_HeaderTimeout = Annotated[
    float,
    typer.Option(
        "--header-timeout",
        min=0.1,
        help="Seconds a whole request head may take to arrive (then 408).",
    ),
]
_BodyTimeout = Annotated[
    float,
    typer.Option(
        "--body-timeout",
        min=0.1,
        help="Seconds a request body may stall between two reads (then 408).",
    ),
]
_KeepaliveTimeout = Annotated[
    float,
    typer.Option(
        "--keepalive-timeout",
        min=0.1,
        help="Seconds an idle keep-alive connection is kept.",
    ),
]
_SendTimeout = Annotated[
    float,
    typer.Option(
        "--send-timeout",
        min=0.1,
        help="Seconds a client may leave its answers unread (nothing sent to it) before the connection is aborted.",
    ),
]
_MaxConnections = Annotated[
    int,
    typer.Option(
        "--max-connections",
        min=1,
        help="Client connections at most; at the cap the oldest idle one (else the slowest request head) is "
        "closed for a new one.",
    ),
]
_AdminMaxConnections = Annotated[
    int,
    typer.Option(
        "--admin-max-connections",
        min=1,
        help="Connections at most on --admin-listen, counted apart from the client-facing listener's.",
    ),
]
_RequestBuffer = Annotated[
    int,
    typer.Option(
        "--request-buffer",
        min=0,
        help="Proxy mode: bytes of a request body read before the upstream request starts (a slow upload "
        "does not hold an upstream connection); longer bodies are streamed.",
    ),
]
_Redis = Annotated[
    str | None,
    typer.Option(
        "--redis",
        show_default=False,
        help="Redis URL; overrides http.storage.",
    ),
]
_LogLevel = Annotated[
    str,
    typer.Option(
        "--log-level",
        envvar="NETLIMIT_LOG_LEVEL",
        help="debug | info | warning | error.",
    ),
]
_LogFormat = Annotated[
    str,
    typer.Option(
        "--log-format",
        envvar="NETLIMIT_LOG_FORMAT",
        help="text (a level on every line; sd-daemon <N> prefixes under journald) | json (one object a line).",
    ),
]
_Grpc = Annotated[
    str | None,
    typer.Option(
        "--grpc",
        show_default=False,
        help="Also serve Envoy's rate limit gRPC API (envoy.service.ratelimit.v3, as envoyproxy/ratelimit) "
        "and grpc.health.v1 on HOST:PORT, on the same rules and store.",
    ),
]
_AdminTokenFile = Annotated[
    Path | None,
    typer.Option(
        "--admin-token-file",
        show_default=False,
        help="A file holding a shared secret (one line, at least 16 characters): the decision, JSON and "
        "operator endpoints then answer 401 to requests without 'Authorization: Bearer <secret>' "
        '(nginx: proxy_set_header Authorization "Bearer ..."; Prometheus: authorization.credentials_file).',
    ),
]
_ShowValues = Annotated[
    bool,
    typer.Option(
        "--show-values",
        help="Show the values of header: descriptors (API keys, tokens) in /v1/top and the logs; by default "
        "they are shown as sha256:<16 hex digits>.",
    ),
]
_Workers = Annotated[
    str,
    typer.Option(
        "--workers",
        "-w",
        envvar="NETLIMIT_SIDECAR_WORKERS",
        help="Worker processes: N > 1 runs N sidecars on SO_REUSEPORT listeners under a supervisor that "
        "restarts them and forwards SIGHUP, limits exact across them (memory: one shared state; Redis: "
        "the store); 0 or auto = one per CPU; 1 = one process, no supervisor.",
    ),
]


def workers_count(value: str) -> int | None:
    """``--workers``: N >= 1, or 0 / auto for one per CPU; None when not a count."""
    v = value.strip().lower()
    if v in ("auto", "0"):
        from .workers import cpu_count

        return cpu_count()
    if v.isdigit() and 1 <= int(v) <= 1024:
        return int(v)
    return None


def register(app: typer.Typer) -> None:
    @app.command()
    def sidecar(
        config: _Config,
        listen: _Listen = "127.0.0.1:8181",
        upstream: _Upstream = None,
        admin_listen: _AdminListen = None,
        upstream_timeout: _UpstreamTimeout = 300.0,
        header_timeout: _HeaderTimeout = 30.0,
        body_timeout: _BodyTimeout = 60.0,
        keepalive_timeout: _KeepaliveTimeout = 75.0,
        send_timeout: _SendTimeout = 60.0,
        max_connections: _MaxConnections = 10_000,
        admin_max_connections: _AdminMaxConnections = 1024,
        request_buffer: _RequestBuffer = 1024 * 1024,
        redis: _Redis = None,
        log_level: _LogLevel = "info",
        log_format: _LogFormat = "text",
        grpc: _Grpc = None,
        admin_token_file: _AdminTokenFile = None,
        show_values: _ShowValues = False,
        workers: _Workers = "1",
    ) -> None:
        """Run the HTTP rate-limit sidecar (decision endpoint, JSON API, or reverse proxy).

        Reloads the rules on SIGHUP and when the file changes; a bad file keeps
        the running rules. Exit 1 when the file is invalid at start.
        """
        from ..cliutil import EXIT_INVALID, EXIT_USAGE, err
        from ..logs import check, problem_fields, setup

        if problem := check(log_level, log_format):
            err(problem)
            raise typer.Exit(EXIT_USAGE)
        n_workers = workers_count(workers)
        if n_workers is None:
            err(f"--workers {workers!r}: expected a number of processes from 1 to 1024, or 0 / auto (one per CPU)")
            raise typer.Exit(EXIT_USAGE)
        setup(log_level, fmt=log_format)
        import logging

        log = logging.getLogger("netlimit.sidecar")
        # from here on every line carries its level (and in JSON the fields)

        from ..config.validate import ConfigError
        from .server import Options, UsageError, run

        opts = Options(
            config=str(config),
            listen=listen,
            upstream=upstream,
            admin_listen=admin_listen,
            upstream_timeout=upstream_timeout,
            header_timeout=header_timeout,
            body_timeout=body_timeout,
            keepalive_timeout=keepalive_timeout,
            send_timeout=send_timeout,
            max_connections=max_connections,
            admin_max_connections=admin_max_connections,
            request_buffer=request_buffer,
            redis=redis,
            grpc=grpc,
            admin_token_file=str(admin_token_file) if admin_token_file is not None else None,
            show_values=show_values,
            workers=n_workers,
            log_level=log_level,
            log_format=log_format,
        )
        try:
            run(opts)
        except UsageError as exc:
            log.error(str(exc))
            raise typer.Exit(EXIT_USAGE) from None
        except ConfigError as exc:
            for p in exc.problems:
                log.error(str(p), extra=problem_fields(p))
            n = len(exc.problems)
            log.error(f"{config}: {n} problem{'s' if n != 1 else ''}; the sidecar did not start")
            raise typer.Exit(EXIT_INVALID) from None
        except SystemExit as exc:
            if isinstance(exc.code, str):
                log.error(exc.code)
                raise typer.Exit(EXIT_USAGE) from None
            raise
