"""Everything about the build is in pyproject.toml; this file only adds the
compiled door when NETLIMIT_MYPYC=1 (netlimit/compiled.py says what and why)."""

import os

from setuptools import setup

ext_modules = []
# NETLIMIT_MYPYC_ASKING: the build backend is only listing what the build needs
# (build_backend/netlimit_build.py), mypy is not installed yet
if os.environ.get("NETLIMIT_MYPYC") == "1" and not os.environ.get("NETLIMIT_MYPYC_ASKING"):
    from mypyc.build import mypycify

    ns: dict = {}
    with open(os.path.join("netlimit", "compiled.py")) as f:
        exec(f.read(), ns)  # standard library only: netlimit is not importable yet
    ext_modules = mypycify(list(ns["SOURCES"]), opt_level="3", group_name="netlimit_door")

setup(ext_modules=ext_modules)
