"""netlimitd: keep the kernel equal to the file.

* service.py     the main loop: apply, reload, drift repair, sd_notify, stop
* kernel_ops.py  the kernel layer behind one facade (apply, drift, flush, counters, ban sets)
* bans.py        the ban list in the kernel: load, follow, repair; the kernel's own bans to the list
* status.py      the Status record, the status socket and its client
* metrics.py     Prometheus metrics
* cli.py         `netlimit daemon` / netlimitd, `status`, `install-service`
"""

from ..statusclient import DEFAULT_SOCKET, query_status
from .cli import register

__all__ = ["DEFAULT_SOCKET", "query_status", "register"]
