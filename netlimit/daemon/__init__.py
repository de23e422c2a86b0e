"""netlimitd: keep the kernel equal to the file.

* service.py     the main loop: apply, reload, drift repair, sd_notify, stop
* kernel_ops.py  the kernel layer behind one facade (apply, drift, flush, counters, ban sets)
* bans.py        the ban list in the kernel: load, follow, repair; the kernel's own bans to the list
* status.py      the Status record, the status socket and its client
* metrics.py     Prometheus metrics
* cli.py         `netlimit daemon`, `status`, `install-service` (typer)
* main.py        `netlimitd` / `python -m netlimit.daemon`: the same daemon without typer

The commands are registered lazily: netlimitd imports this package, and its start
must not pay for typer (issue 35).
"""

from typing import Any

from ..statusclient import DEFAULT_SOCKET, query_status

__all__ = ["DEFAULT_SOCKET", "query_status", "register"]


def register(app: Any) -> None:
    """The daemon's commands on the `netlimit` app (netlimit/cli.py's registry)."""
    from .cli import register as register_commands

    register_commands(app)
