"""Everything about the build is in pyproject.toml; this file only adds the
compiled door when NETLIMIT_MYPYC=1 (netlimit/compiled.py says what and why)."""

import os

from setuptools import setup

ext_modules = []
if os.environ.get("NETLIMIT_MYPYC") == "1":
    from mypyc.build import mypycify

    ns: dict = {}
    with open(os.path.join("netlimit", "compiled.py")) as f:
        exec(f.read(), ns)  # standard library only: netlimit is not importable yet
    ext_modules = mypycify(list(ns["SOURCES"]), opt_level="3", group_name="netlimit_door")

setup(ext_modules=ext_modules)
