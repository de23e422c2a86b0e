"""setuptools' build backend, plus mypy (for mypyc) among the build's requirements
when NETLIMIT_MYPYC=1 asks for the compiled door (setup.py, netlimit/compiled.py).
A build without the variable needs only setuptools, as before."""

from __future__ import annotations

import os
import tomllib
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403  (every hook as setuptools has it)


def _compiler() -> list[str]:
    """The mypy (hence mypyc) the lint pins in pyproject.toml's test extra."""
    if os.environ.get("NETLIMIT_MYPYC") != "1":
        return []
    with open("pyproject.toml", "rb") as f:  # the build runs in the source tree
        test = tomllib.load(f)["project"]["optional-dependencies"]["test"]
    return [r for r in test if r.startswith("mypy==")]


def _asking(hook: Any, config_settings: dict[str, Any] | None) -> list[str]:
    """setuptools runs setup.py to list the requirements, before mypy is installed:
    setup.py leaves the extensions out while this is set."""
    os.environ["NETLIMIT_MYPYC_ASKING"] = "1"
    try:
        return list(hook(config_settings)) + _compiler()
    finally:
        del os.environ["NETLIMIT_MYPYC_ASKING"]


def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    return _asking(_setuptools.get_requires_for_build_wheel, config_settings)


def get_requires_for_build_editable(config_settings: dict[str, Any] | None = None) -> list[str]:
    return _asking(_setuptools.get_requires_for_build_editable, config_settings)
