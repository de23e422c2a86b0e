"""Optional parts of netlimit and the one-line message when one is missing.

The core install (``pip install netlimit``) carries what netlimitd and the
sidecar need. Three parts are extras, imported only where they are used:

* ``report``: matplotlib, for the plots of ``netlimit simulate --report``;
* ``iptables``: python-iptables, for ``--backend python-iptables`` (the
  nftables and iptables-legacy-restore backends need no Python package);
* ``grpc``: grpcio, grpcio-health-checking and protobuf, for ``netlimit
  sidecar --grpc`` (Envoy's rate limit service).

A command that needs a missing extra stops before it changes anything and
says, in one line, which ``pip install 'netlimit[EXTRA]'`` brings it.
"""

from __future__ import annotations

import importlib.util

from .errors import NetlimitError

#: extra -> (the modules it provides, what needs them)
EXTRAS: dict[str, tuple[tuple[str, ...], str]] = {
    "report": (("matplotlib",), "netlimit simulate --report (the report's plots)"),
    "iptables": (("iptc",), "the python-iptables backend"),
    "grpc": (("grpc", "grpc_health", "google.protobuf"), "netlimit sidecar --grpc (Envoy's rate limit service)"),
}


class MissingExtra(NetlimitError):
    """A command needs an optional part that is not installed."""

    def __init__(self, extra: str, module: str):
        _, what = EXTRAS[extra]
        super().__init__(f"{what} needs {module}, which is not installed: pip install 'netlimit[{extra}]'")
        self.extra = extra
        self.module = module


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package is missing, or a broken entry in sys.modules
        return False


def missing(extra: str) -> str | None:
    """None when `extra` is installed, else the one-line message naming the pip command."""
    modules, _ = EXTRAS[extra]
    for module in modules:
        if not _installed(module):
            return str(MissingExtra(extra, module))
    return None


def require(extra: str) -> None:
    """Raise MissingExtra when `extra` is not installed."""
    modules, _ = EXTRAS[extra]
    for module in modules:
        if not _installed(module):
            raise MissingExtra(extra, module)
