"""``netlimit_build_info{version}`` and ``netlimit_config_info{sha256}``: one
series each, value 1, on netlimitd's and the sidecar's /metrics, so that a
fleet's convergence is one query::

    count by (job) (count by (job, sha256) (netlimit_config_info)) > 1

(more than one config running among the hosts of a job; alerts/ has the alert).
The sha256 is the running config's (``Loaded.sha256``: the file, its
lyft_config_dir and its ``include:`` files), the same that ``netlimit status``
and ``validate --json`` print.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterator
from typing import Any


def version() -> str:
    """netlimit's version: ``netlimit.__version__``, else the installed distribution's."""
    import netlimit

    v = getattr(netlimit, "__version__", None)
    if v:
        return str(v)
    try:
        from importlib.metadata import version as dist_version

        return dist_version("netlimit")
    except Exception:  # not installed (a source tree): still a value
        return "unknown"


class InfoCollector:
    """A prometheus_client collector of the two info series; ``sha256`` is asked at
    scrape time (None or "": no config loaded yet, no series)."""

    def __init__(self, sha256: Callable[[], str | None]):
        self.sha256 = sha256

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        b = GaugeMetricFamily("netlimit_build_info", "netlimit's version (value 1)", labels=["version", "python"])
        b.add_metric([version(), platform.python_version()], 1)
        yield b
        c = GaugeMetricFamily(
            "netlimit_config_info",
            "sha256 of the running config: the file, its lyft_config_dir and include: files (value 1)",
            labels=["sha256"],
        )
        sha = self.sha256()
        if sha:
            c.add_metric([sha], 1)
        yield c
