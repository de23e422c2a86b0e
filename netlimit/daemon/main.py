"""`netlimitd`: the daemon's own entry point, without the command line's framework.

`netlimit daemon` goes through typer (click, every layer's commands registered):
0.1-0.3 s of imports a restart does not need before READY=1 (issue 35: ready with
100,000 bans within 1.5 s). Here the daemon's options are read by hand when they
are all plain (`--config FILE`, `--resync=5`, `-c FILE`, ...); anything else --
`--help`, an unknown or misspelt option, a value typer would refuse -- goes to
`netlimit daemon` itself (`netlimit.cli.daemon_main`), so the help, the usage errors
and their exit codes stay typer's, in one place (netlimitd execs it). `python -m netlimit.daemon` is the
same (the drills and tests start it so).

`tests/daemon/test_daemon_main.py` guards it: the options give what typer gives,
and the start path imports neither typer nor the CLI.
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

#: option -> (destination, conversion); the same options as daemon/cli.py's `daemon`
_OPTIONS: dict[str, str] = {
    "--config": "config",
    "-c": "config",
    "--resync": "resync",
    "--metrics": "metrics",
    "--netns": "netns",
    "--socket": "socket_path",
    "--backend": "backend",
    "--log-level": "log_level",
    "--log-format": "log_format",
}
EXIT_USAGE = 64  # netlimit.cliutil's (that module imports typer)
#: what netlimitd execs for what only typer answers: the registry is a process away (a
#: layer never imports it, docs/architecture.md)
_TYPER = "import sys; from netlimit.cli import daemon_main; sys.argv[0] = 'netlimitd'; daemon_main()"


def parse(argv: list[str]) -> dict[str, object] | None:
    """The options of `argv` (after the program name), or None where typer must decide
    (help, an unknown option, a missing or refused value)."""
    from ..statusclient import DEFAULT_SOCKET

    got: dict[str, str] = {}
    i = 0
    while i < len(argv):
        tok = argv[i]
        name, eq, value = tok.partition("=") if tok.startswith("--") else (tok, "", "")
        dest = _OPTIONS.get(name)
        if dest is None:
            return None  # --help, --install-completion, a typo, an argument: typer's answer
        if not eq:
            if i + 1 >= len(argv):
                return None  # "requires an argument": typer says it
            value = argv[i + 1]
            i += 1
        got[dest] = value
        i += 1
    try:
        resync = float(got.get("resync", "30"))
    except ValueError:
        return None
    if not resync >= 0.2:  # typer's min=0.2 (NaN too)
        return None
    return {
        "config": Path(got.get("config", "/etc/netlimit/netlimit.yaml")),
        "resync": resync,
        "metrics": got.get("metrics"),
        "netns": got.get("netns"),
        "socket_path": got.get("socket_path", DEFAULT_SOCKET),
        "backend": got.get("backend"),
        # typer's envvar: the command line first, then a non-empty variable, then the default
        "log_level": got.get("log_level") or os.environ.get("NETLIMIT_LOG_LEVEL") or "info",
        "log_format": got.get("log_format") or os.environ.get("NETLIMIT_LOG_FORMAT") or "text",
    }


def run(
    config: Path,
    resync: float,
    metrics: str | None,
    netns: str | None,
    socket_path: str,
    backend: str | None,
    log_level: str,
    log_format: str,
    err=None,
) -> int:
    """netlimitd's body (`netlimit daemon` calls it too): logging, the checks, the service."""
    import logging

    from ..logs import check, setup

    if problem := check(log_level, log_format):
        (err or _err)(problem)
        return EXIT_USAGE
    setup(log_level, "netlimitd: ", fmt=log_format)
    log = logging.getLogger("netlimit.daemon")
    if os.geteuid() != 0:
        log.error("netlimit daemon: must run as root (it changes nftables or iptables rules and tc)")
        return EXIT_USAGE
    if metrics and ":" not in metrics:
        log.error(f"--metrics {metrics!r}: expected HOST:PORT, e.g. 127.0.0.1:9732")
        return EXIT_USAGE
    from .service import run_daemon

    return run_daemon(config, resync, netns, socket_path, metrics, backend)


def _err(message: str) -> None:
    print(message, file=sys.stderr)


def main() -> None:
    gc.disable()  # the imports too make many objects; service.run_daemon enables it at READY=1
    opts = parse(sys.argv[1:])
    if opts is None:  # typer's answer (help, a usage error): `netlimit daemon` in this process's place
        os.execv(sys.executable, [sys.executable, "-c", _TYPER, *sys.argv[1:]])
    _begin_early(opts)
    sys.exit(run(**opts))  # type: ignore[arg-type]


def _begin_early(opts: dict[str, object]) -> None:
    """Begin reading the ban sets before the imports (daemon/readahead.py), of the backend
    --backend or $NETLIMIT_BACKEND names, else the default; not when we are not root
    (run() refuses to start). A backend that cannot read its sets ahead reads nothing."""
    if os.geteuid() != 0:
        return
    from ..kernel.registry import guess
    from .readahead import begin_early

    begin_early(opts["netns"], guess(opts["backend"]))  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
