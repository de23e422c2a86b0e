"""vagrant/scenario.py as a module for the tests.

The scenario is a script (copied beside tools.py, run by vagrant/run.sh), not
part of the netlimit package, so the tests load it from its path, once.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCENARIO = Path(__file__).resolve().parents[2] / "vagrant" / "scenario.py"
NAME = "netlimit_vagrant_scenario"


def load_scenario() -> ModuleType:
    if NAME in sys.modules:
        return sys.modules[NAME]
    spec = importlib.util.spec_from_file_location(NAME, SCENARIO)
    assert spec and spec.loader, SCENARIO
    mod = importlib.util.module_from_spec(spec)
    sys.modules[NAME] = mod  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod
