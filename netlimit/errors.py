"""The errors netlimit raises on purpose, one family under :class:`NetlimitError`.

Each carries what an operator (or a client) needs to act: a config error lists
every problem with FILE:LINE:COL, an apply error names the rule the kernel
refused and whether the previous state was restored, a bad request names the
field.  Anything else that escapes is a bug.  This module imports nothing of
netlimit's, so every layer can use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class NetlimitError(Exception):
    """Base class of every error netlimit raises on purpose."""


class ConfigError(NetlimitError):
    """A file that cannot be used; ``problems`` lists every reason (config.loader.Problem,
    each printed as FILE:LINE:COL: RULE: MESSAGE)."""

    def __init__(self, problems: Sequence[Any]):
        super().__init__("\n".join(str(p) for p in problems))
        self.problems = list(problems)


class ApplyError(NetlimitError):
    """The kernel refused a change; ``rule`` names the rule when known, and
    ``rolled_back`` says whether the previous state was restored."""

    def __init__(self, message: str, rule: str | None = None, rolled_back: bool = True):
        super().__init__(message)
        self.rule = rule
        self.rolled_back = rolled_back


class StoreError(NetlimitError):
    """A store could not decide in time (timeout, connection refused, server
    error).  The limiter catches it and applies ``on_store_failure``."""


class BadRequest(NetlimitError, ValueError):
    """A rate-limit request the engine cannot decide; the message names the field
    (``descriptors[2].entries[0].key must not be empty``).  Both doors answer it
    as a client error (HTTP 400, gRPC INVALID_ARGUMENT)."""
