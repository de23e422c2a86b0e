"""Kernel backends: how the compiled objects reach the kernel.

Packet filter (one of, chosen by `choose`):

* ``nftables`` (nftables.py): one table `inet netlimit`, written with `nft -f`,
  read over netlink (nfnetlink.py); the default where the host's `iptables` is the
  nf_tables variant (Debian 12+, Ubuntu 22.04+, RHEL 9+, Fedora) or legacy
  x_tables are not usable;
* ``restore`` (restore.py): iptables-legacy-save / -restore, one atomic restore
  per family; the default on a legacy host where those programs are installed;
* ``python-iptables`` (libiptc.py): the same legacy x_tables through libiptc.

The two legacy ones share xtables.py (the family loop, `list` rows) and the planner
in netlimit/kernel/iptables_plan.py. Shaping: tc.py (pyroute2), whatever the filter
backend.

A filter backend is the small interface `FilterBackend` below; reconcile.py
uses nothing else. A state comes back to the backend that read it, and a plan to
the backend that made it. Every call works in the calling thread's network
namespace (netns.run_in_netns puts the thread there); callers hold
netns.kernel_lock(), and writers netns.writer_lock().
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
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


BACKENDS = ("nftables", "restore", "python-iptables")
LEGACY = ("restore", "python-iptables")
BACKEND_ENV = "NETLIMIT_BACKEND"
_ALIASES = {
    "nft": "nftables",
    "iptables-restore": "restore",
    "iptables-legacy-restore": "restore",
    "iptc": "python-iptables",
    "pyiptc": "python-iptables",
    "libiptc": "python-iptables",
}


@dataclass(frozen=True)
class Choice:
    key: str  # one of BACKENDS
    why: str  # for `plan` and `list`: "auto: this host's iptables is the nf_tables variant (...)"


def choose(name: str | None = None, configured: str | None = None) -> Choice:
    """The packet-filter backend: `name` (--backend), else $NETLIMIT_BACKEND, else
    `configured` (the file's `backend:`), else auto: nftables where the host's
    `iptables` is the nf_tables variant or legacy x_tables are not usable, the legacy
    backend where the host is on legacy (restore where iptables-legacy-restore is
    installed, else python-iptables)."""
    env = os.environ.get(BACKEND_ENV, "").strip()
    for value, source in ((name, "--backend"), (env, BACKEND_ENV), (configured, "the file's backend:")):
        choice = (value or "").strip().lower()
        if not choice or choice == "auto":
            continue
        key = _ALIASES.get(choice, choice)
        if key not in BACKENDS:
            raise ApplyError(
                f"unknown backend {choice!r} (from {source}): choose one of {', '.join(BACKENDS)} or auto",
                None,
                rolled_back=False,
            )
        return Choice(key, f"{source} {key}")
    return _auto()


def _auto() -> Choice:
    variant, version = host_iptables_variant()
    legacy_why = legacy_unusable()
    nft_ok = backend("nftables").available() is None
    if nft_ok and variant == "nf_tables":
        return Choice("nftables", f"auto: this host's iptables is the nf_tables variant ({version})")
    if nft_ok and legacy_why is not None:
        return Choice("nftables", f"auto: legacy x_tables are not usable here ({legacy_why})")
    if legacy_why is None:
        if variant == "nf_tables":
            why = f"auto: nft is not installed (apt-get install nftables), so legacy x_tables ({version})"
        else:
            kind = "iptables-legacy" if variant == "legacy" else "not the nf_tables variant"
            why = f"auto: this host's iptables is {kind} ({version})"
        return Choice(_legacy_key(), why)
    raise ApplyError(
        f"no packet-filter backend is usable here: nft is not installed (apt-get install nftables) "
        f"and legacy x_tables are not usable ({legacy_why})",
        None,
        rolled_back=False,
    )


def _legacy_key() -> str:
    from .restore import binaries_missing

    return "python-iptables" if binaries_missing() else "restore"


def legacy_unusable() -> str | None:
    """None when this host can run a legacy x_tables backend, else why not: the kernel
    has no ip_tables (CONFIG_IP_NF_IPTABLES_LEGACY off, as RHEL 9 ships), or neither
    iptables-legacy-restore nor python-iptables is installed."""
    import importlib.util

    kernel = os.path.exists("/proc/net/ip_tables_names") or os.path.isdir("/sys/module/ip_tables")
    if not kernel:
        release = os.uname().release
        kernel = any(
            os.path.exists(f"/lib/modules/{release}/kernel/net/ipv4/netfilter/ip_tables.ko{ext}")
            for ext in ("", ".xz", ".zst", ".gz")
        )
    if not kernel:
        return "the kernel has no ip_tables (legacy x_tables)"
    if backend("restore").available() is not None and importlib.util.find_spec("iptc") is None:
        return (
            "neither iptables-legacy-restore (apt-get install iptables) nor python-iptables "
            "(pip install 'netlimit[iptables]') is installed"
        )
    return None


def backend_name(name: str | None = None, configured: str | None = None) -> str:
    """The key of `choose(name, configured)`."""
    return choose(name, configured).key


def host_iptables_variant() -> tuple[str, str]:
    """('nf_tables' | 'legacy' | 'unknown', version line) of the `iptables` on PATH."""
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


def get_backend(name: str | None = None, configured: str | None = None) -> FilterBackend:
    return backend(backend_name(name, configured))


def backend(key: str) -> FilterBackend:
    """The backend called `key` (one of BACKENDS)."""
    if key == "nftables":
        from .nftables import NftablesBackend

        return NftablesBackend()
    if key == "restore":
        from .restore import RestoreBackend

        return RestoreBackend()
    from .libiptc import LibiptcBackend

    return LibiptcBackend()


def others(key: str) -> list[FilterBackend]:
    """The filter backends other than `key` whose objects netlimit removes once `key`
    holds the rules (switching between nftables and legacy x_tables): nftables for a
    legacy backend, the host's legacy backend for nftables; only where usable."""
    if key == "nftables":
        return [backend(_legacy_key())] if legacy_unusable() is None else []
    nft = backend("nftables")
    return [nft] if nft.available() is None else []
