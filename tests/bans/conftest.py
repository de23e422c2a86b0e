"""Fixtures of the ban tests: a fresh key prefix per test on the session's real Redis."""

from __future__ import annotations

import itertools
import os

import pytest

_seq = itertools.count()


@pytest.fixture
def prefix():
    return f"nlt{os.getpid()}-{next(_seq)}"
