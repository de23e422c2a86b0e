"""The modules a release build compiles to C with mypyc, and which of them this
install runs compiled.

The decision door spends most of a decision in Python: the HTTP connection's
llhttp callbacks, the head checks, the endpoint and the answer's bytes.  Compiled
(``NETLIMIT_MYPYC=1`` at build time: setup.py, the .deb and the OCI image do it),
the same source takes about 38 % fewer instructions per decision
(bench/door_instructions.sh; docs/performance.md has the figures).  A build
without it (``pip install -e .``, an sdist without the variable) runs the same
modules as Python: compiling is an optimisation, never a different behaviour,
and tests/sidecar/test_compiled_door.py runs the door's tests on both.

This module is read by setup.py before netlimit is importable: standard library
only.
"""

from __future__ import annotations

import importlib.machinery
import sys

#: the source files compiled, relative to the project root (setup.py's mypycify);
#: modules only, imported by the door on every request
SOURCES = (
    "netlimit/sidecar/http11/__init__.py",
    "netlimit/sidecar/http11/body.py",
    "netlimit/sidecar/http11/connection.py",
    "netlimit/sidecar/http11/head.py",
    "netlimit/sidecar/http11/limits.py",
    "netlimit/sidecar/http11/state.py",
    "netlimit/sidecar/endpoints.py",
    "netlimit/sidecar/responses.py",
)


def module_names() -> list[str]:
    """The dotted names of SOURCES."""
    out = []
    for src in SOURCES:
        name = src.removesuffix(".py").replace("/", ".")
        out.append(name.removesuffix(".__init__"))
    return out


_EXTENSIONS = tuple(importlib.machinery.EXTENSION_SUFFIXES)


def running() -> list[str]:
    """The SOURCES modules imported so far that were loaded from a compiled extension."""
    out = []
    for name in module_names():
        mod = sys.modules.get(name)
        if str(getattr(mod, "__file__", "")).endswith(_EXTENSIONS):
            out.append(name)
    return out
