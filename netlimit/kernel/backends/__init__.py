"""Kernel backends: how the compiled objects reach the kernel.

Packet filter (one of, chosen by `--backend` / $NETLIMIT_BACKEND):

* ``restore`` (restore.py): iptables-legacy-save / -restore, one atomic restore
  per family; the default where those programs are installed;
* ``python-iptables`` (libiptc.py): the same legacy x_tables through libiptc.

Both share xtables.py (the family loop, `list` rows) and the planner in
netlimit/kernel/iptables_plan.py. Shaping: tc.py (pyroute2), whatever the filter
backend.

A filter backend is the small interface `FilterBackend` below; reconcile.py
uses nothing else. A state comes back to the backend that read it, and a plan to
the backend that made it. Every call works in the calling thread's network
namespace (netns.run_in_netns puts the thread there); callers hold
netns.kernel_lock(), and writers netns.writer_lock().
"""

from __future__ import annotations

import os
from typing import Any, Protocol

from ...errors import ApplyError
from ..objects import Desired


class FilterState(Protocol):
    """What netlimit owns in the packet filter now."""

    @property
    def empty(self) -> bool: ...
    def count(self) -> int: ...


class FilterPlan(Protocol):
    """The edit that makes the kernel equal to the file; `lines()` for plan --live / apply."""

    @property
    def empty(self) -> bool: ...
    def lines(self) -> list[str]: ...


class FilterBackend(Protocol):
    key: str  # what --backend calls it
    name: str  # what messages call it

    def available(self) -> str | None:
        """None when this backend can work here, else why not (a sentence)."""
        ...

    def read(self) -> FilterState:
        """What netlimit owns now, counters included."""
        ...

    def plan(self, desired: Desired, state: Any) -> FilterPlan:
        """The smallest edit from `state` (as this backend read it) to `desired`; no writes.
        Raises ApplyError when the desired rules cannot be installed here at all."""
        ...

    def write(self, plan: Any) -> None:
        """Carry out `plan`, atomically per table; raises (naming the rule) on refusal."""
        ...

    def restore(self, state: Any) -> None:
        """Put back exactly `state` (rollback, `apply --confirm`), counters included."""
        ...

    def rows(self, state: Any) -> list[dict[str, Any]]:
        """`list` rows for every owned object: rule, layer, object, packets, bytes, dropped."""
        ...


BACKENDS = ("restore", "python-iptables")
BACKEND_ENV = "NETLIMIT_BACKEND"
_ALIASES = {
    "iptables-restore": "restore",
    "iptables-legacy-restore": "restore",
    "iptc": "python-iptables",
    "pyiptc": "python-iptables",
    "libiptc": "python-iptables",
}


def backend_name(name: str | None = None) -> str:
    """'restore' or 'python-iptables': `name`, else $NETLIMIT_BACKEND, else 'restore' when
    iptables-legacy-save/-restore (and ip6tables-) are installed, else python-iptables."""
    choice = (name or os.environ.get(BACKEND_ENV) or "auto").strip().lower()
    if choice in ("auto", ""):
        from .restore import binaries_missing

        return "python-iptables" if binaries_missing() else "restore"
    choice = _ALIASES.get(choice, choice)
    if choice not in BACKENDS:
        raise ApplyError(
            f"unknown iptables backend {choice!r} (from {'--backend' if name else BACKEND_ENV}): "
            f"choose one of {', '.join(BACKENDS)} or auto",
            None,
            rolled_back=False,
        )
    return choice


def host_iptables_variant() -> tuple[str, str]:
    """('nf_tables' | 'legacy' | 'unknown', version line) of the `iptables` on PATH."""
    import shutil
    import subprocess

    exe = shutil.which("iptables")
    if not exe:
        return "unknown", "no iptables command on PATH"
    try:
        out = subprocess.run([exe, "-V"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "unknown", str(exc)
    if "nf_tables" in out:
        return "nf_tables", out
    if "legacy" in out:
        return "legacy", out
    real = os.path.realpath(exe)
    return ("legacy" if "legacy" in real else "unknown"), out


def get_backend(name: str | None = None) -> FilterBackend:
    if backend_name(name) == "restore":
        from .restore import RestoreBackend

        return RestoreBackend()
    from .libiptc import LibiptcBackend

    return LibiptcBackend()
