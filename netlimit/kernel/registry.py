"""The kernel backends by name: the one module that knows them (issue 30).

Packet filter (one of, chosen by `choose`), each in its family's folder:

* ``nftables`` (nft/): one table `inet netlimit`, written with `nft -f`,
  read over netlink (nft/netlink.py); the default where the host's `iptables` is the
  nf_tables variant (Debian 12+, Ubuntu 22.04+, RHEL 9+, Fedora) or legacy
  x_tables are not usable;
* ``restore`` (xtables/restore.py): iptables-legacy-save / -restore, one atomic restore
  per family; the default on a legacy host where those programs are installed;
* ``python-iptables`` (xtables/libiptc.py): the same legacy x_tables through libiptc.

The two legacy ones share xtables/backend.py (the family loop, `list` rows) and the
planner xtables/plan.py. Shaping: tc/shaping.py (pyroute2), whatever the filter
backend.

A filter backend is the small interface `FilterBackend` below; reconcile.py and every
other caller use nothing else, and no code outside a family's folder and this module
compares a backend's name (tests/test_architecture.py): what differs between families
is an attribute or method of the backend. A state comes back to the backend that read
it, and a plan to the backend that made it. Every call works in the calling thread's
network namespace (netns.run_in_netns puts the thread there); callers hold
netns.kernel_lock(), and writers netns.writer_lock().

A new backend is one folder plus one line in REGISTERED. This module imports no
family (it names each by where it lives and loads it on first use), so the config
model can read the names for its schema without importing the kernel.
"""

from __future__ import annotations

import importlib
import os
import shutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import ApplyError

if TYPE_CHECKING:
    from .objects import Desired


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

    # --- what the rest of netlimit asks of a family instead of comparing its name ---
    layer: str  # a rule's layer in `list` and apply's summary: "nftables", "iptables"
    kind: str  # what flush says it removed: "nftables", "iptables/ip6tables"
    write_unit: str  # how one apply writes, for the demo: "one nft transaction"
    tools: tuple[str, ...]  # the programs the demo needs to see this backend's counters

    def ban_sets(self) -> Any:
        """The writer of the ban sets' elements (banset.BanSets)."""
        ...

    def hot(self, rule_names: list[str]) -> list[dict[str, Any]]:
        """Per-source entries of the rules' kernel tables (hot.py): {rule, table, source, score, detail}."""
        ...

    def plan_summary(self, desired: Desired) -> tuple[int, str]:
        """(packet-filter objects, "N nftables rules, ...") for `plan`'s header."""
        ...

    def plan_sections(self, desired: Desired) -> list[str]:
        """`plan`'s packet-filter sections as text lines (render.plan_text)."""
        ...

    def plan_doc(self, desired: Desired) -> dict[str, Any]:
        """`plan --json`'s packet-filter keys (render.plan_dict)."""
        ...

    def warnings(self, loaded: Any) -> list[Any]:
        """What a file means differently under this backend (config Problems)."""
        ...

    def note(self, netns: str | None) -> str | None:
        """A word for `apply` about where this backend's rules show up on this host."""
        ...

    def prune_state(self) -> None:
        """Drop what /run/netlimit remembers for namespaces that no longer exist."""
        ...


@dataclass(frozen=True)
class Registration:
    key: str  # what --backend and `backend:` call it
    where: str  # "module:Class" of its FilterBackend
    aliases: tuple[str, ...] = ()
    help: str = ""  # a few words for --backend's help


#: every backend netlimit knows, in the order `--backend` lists them: one line each
REGISTERED = (
    Registration("nftables", "netlimit.kernel.nft.backend:NftablesBackend", ("nft",), "one table inet netlimit"),
    Registration(
        "restore",
        "netlimit.kernel.xtables.restore:RestoreBackend",
        ("iptables-restore", "iptables-legacy-restore"),
        "iptables-legacy-save/-restore",
    ),
    Registration(
        "python-iptables", "netlimit.kernel.xtables.libiptc:LibiptcBackend", ("iptc", "pyiptc", "libiptc"), "libiptc"
    ),
)


BACKENDS = tuple(r.key for r in REGISTERED)
NFT = "nftables"
LEGACY = ("restore", "python-iptables")
DEFAULT = NFT  # the ban sets' writer before any apply chose (daemon)
BACKEND_ENV = "NETLIMIT_BACKEND"
_ALIASES = {a: r.key for r in REGISTERED for a in r.aliases}


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


def guess(name: str | None = None) -> str:
    """The backend a start can name before its file is read: `name` (--backend), else
    $NETLIMIT_BACKEND, else DEFAULT (also for auto, or a name choose() will refuse).
    netlimitd's early read of the ban sets goes by it (daemon/readahead.py); the file
    or auto may choose otherwise, and then that read is not taken."""
    env = os.environ.get(BACKEND_ENV, "").strip()
    for value in (name, env):
        choice = (value or "").strip().lower()
        if choice and choice != "auto":
            key = _ALIASES.get(choice, choice)
            return key if key in BACKENDS else DEFAULT
    return DEFAULT


def _auto() -> Choice:
    variant, version = host_iptables_variant()
    legacy_why = legacy_unusable()
    nft_ok = backend(NFT).available() is None
    if nft_ok and variant == "nf_tables":
        return Choice(NFT, f"auto: this host's iptables is the nf_tables variant ({version})")
    if nft_ok and legacy_why is not None:
        return Choice(NFT, f"auto: legacy x_tables are not usable here ({legacy_why})")
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
    return "python-iptables" if backend("restore").available() is not None else "restore"


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


def backend(key: str | None = None) -> FilterBackend:
    """The backend called `key` (one of BACKENDS; None: DEFAULT)."""
    key = key or DEFAULT
    for r in REGISTERED:
        if r.key == key:
            module, cls = r.where.split(":")
            return getattr(importlib.import_module(module), cls)()
    raise ApplyError(f"unknown backend {key!r}: choose one of {', '.join(BACKENDS)}", None, rolled_back=False)


def others(key: str) -> list[FilterBackend]:
    """The filter backends other than `key` whose objects netlimit removes once `key`
    holds the rules (switching between nftables and legacy x_tables): nftables for a
    legacy backend, the host's legacy backend for nftables; only where usable."""
    if key == NFT:
        return [backend(_legacy_key())] if legacy_unusable() is None else []
    if key not in LEGACY:
        return []
    nft = backend(NFT)
    return [nft] if nft.available() is None else []


def prune_state() -> None:
    """Every backend drops what it remembers of namespaces that no longer exist."""
    for r in REGISTERED:
        backend(r.key).prune_state()


def help_text() -> str:
    """--backend's help: the names, from REGISTERED."""
    spelled = [f"{r.key} ({r.help})" if r.help else r.key for r in REGISTERED]
    return (
        f"How network rules reach the kernel: {', '.join(spelled)}. Default: ${BACKEND_ENV}, else the file's "
        "`backend:`, else auto: nftables where this host's iptables is the nf_tables variant or legacy "
        "x_tables are unusable, the legacy backend on a legacy host."
    )
