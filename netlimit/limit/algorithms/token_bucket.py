"""The token bucket."""

from __future__ import annotations

from .base import Algorithm, Limit, _deny_all, register
from .bucket import _bucket, decider, is_idle, store_hit


def token_bucket(limit: Limit, state: complex | None, now: float, cost: int = 1):
    """Token bucket: ``rate = limit/period`` tokens/s refill a bucket of ``burst``
    (default ``limit``) tokens; a request takes ``cost`` tokens or is rejected.

    State: ``complex(tokens, last_update)``.  Example: 10/s burst 20 -> 20
    allowed at t=0, the 21st is rejected with ``retry_after = 0.1``.
    ``remaining`` = whole tokens left, ``reset`` = time until the bucket is full.
    """
    if limit.limit == 0:
        return _deny_all(cost), state
    return _bucket(limit, state, now, cost)


ALGORITHM = register(
    Algorithm(
        "token_bucket",
        "tb",
        token_bucket,
        decider,
        is_idle,
        lua="bucket.lua",
        lua_now_string=True,
        bucket=True,
        store_hit=store_hit,
    )
)
