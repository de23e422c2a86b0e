"""Build hook for the one C module (the HTTP fast paths' head parser and 200 formatter);
everything else is declared in pyproject.toml.  ``optional=True``: without a C
compiler the package installs anyway and netlimit.sidecar.httphead uses its
Python implementation."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("netlimit.sidecar._httphead", ["netlimit/sidecar/_httphead.c"], optional=True)])
