"""The leaky bucket, as a meter or as a queue (nginx ``limit_req``)."""

from __future__ import annotations

from .base import Algorithm, Limit, _deny_all, register
from .bucket import _bucket, decider, is_idle, store_hit


def leaky_bucket(limit: Limit, state: complex | None, now: float, cost: int = 1):
    """Leaky bucket of ``capacity = burst or limit`` units draining at ``limit/period``/s.

    State: ``complex(capacity - level, last_update)`` (the room left, see above).

    Meter mode (``delay=False``): a request is admitted at once if it fits in the
    bucket, else rejected (mathematically a token bucket; ``reset`` = time until
    the bucket is empty).

    Queue mode (``delay=True``), like nginx ``limit_req burst=capacity`` without
    ``nodelay``: the water in the bucket is the queue; a request is admitted if at
    most ``capacity`` units wait ahead of it, and ``Decision.delay`` (= level /
    rate) tells the caller how long to hold it so that requests leave one slot
    (``period/limit``) apart.  So at an idle key ``capacity + 1`` requests are
    admitted at once (one immediately, ``capacity`` delayed), as in nginx;
    ``Decision.limit`` reports that ``capacity + 1``.
    """
    if limit.limit == 0:
        return _deny_all(cost), state
    return _bucket(limit, state, now, cost)


ALGORITHM = register(
    Algorithm(
        "leaky_bucket",
        "lb",
        leaky_bucket,
        decider,
        is_idle,
        lua="bucket.lua",
        lua_now_string=True,
        bucket=True,
        store_hit=store_hit,
        queue=True,
    )
)
