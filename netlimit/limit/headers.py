"""Rate-limit response headers and the 429 problem body.

Sent for the reported (most constraining, enforced) rule of a decision:

==========================  ====================================================
``X-RateLimit-Limit``       the algorithm's quota (bucket capacity / window limit)
``X-RateLimit-Remaining``   requests left now
``RateLimit-Policy``        IETF draft: ``"<rule>";q=<requests_per_unit>;w=<unit seconds>``
``RateLimit``               IETF draft: ``"<rule>";r=<remaining>;t=<seconds to reset, rounded up>``
``X-RateLimit-Retry-After`` denied only: whole seconds, rounded up (>= 1)
``Retry-After``             denied only: same value (RFC 9110 delay-seconds)
==========================  ====================================================

A request that can never be admitted (cost above the capacity, a limit of 0)
gets ``Retry-After`` = the rule's unit in seconds.
"""

from __future__ import annotations

import json
import math

from .limiter import SRC_CLOSED, CheckResult, DescriptorStatus

PROBLEM_TYPE = "application/problem+json"
#: header carrying the problem body to nginx (auth_request cannot read bodies)
PROBLEM_HEADER = "X-Netlimit-Problem"

_ceil = math.ceil
_inf = math.inf
_isnan = math.isnan


def retry_seconds(st: DescriptorStatus) -> int:
    """Whole seconds until a retry can succeed, rounded up, at least 1."""
    # a reported status always carries its decision (limiter.py); no None check per request
    ra = st.decision.retry_after  # type: ignore[union-attr]
    if ra == _inf or _isnan(ra):
        p = st.rule.period if st.rule is not None else 0
        return p if p >= 1 else 1
    # 1e-6 absorbs float noise of `reset - now` at epoch magnitudes (ulp ~2e-7)
    s = _ceil(ra - 1e-6)
    return s if s >= 1 else 1


def reset_seconds(reset: float) -> int:
    """A decision's ``reset`` in whole seconds, rounded up: Lyft's
    ``duration_until_reset`` (``unit - now % unit``; 1e-6 absorbs the float
    noise of ``reset - now``), 0 when nothing is to reset."""
    if not reset > 0 or reset == _inf:
        return 0
    return _ceil(reset - 1e-6)


def rate_headers(result: CheckResult) -> dict[str, str]:
    """Headers for a decision (allowed or denied); empty when no rule applied."""
    st = result.report
    if st is None:
        return {}
    # a reported status always carries its decision and rule (limiter.py): the ignores
    # below spare a None check per request on the hot path
    d = st.decision
    rule = st.rule
    rem = d.remaining  # type: ignore[union-attr]
    reset = d.reset  # type: ignore[union-attr]
    t = _ceil(reset - 1e-6) if reset > 0 else 0
    h = {
        "X-RateLimit-Limit": str(d.limit),  # type: ignore[union-attr]
        "X-RateLimit-Remaining": str(rem),
        "RateLimit-Policy": rule.policy,  # type: ignore[union-attr]
        "RateLimit": f"{rule.sf_name};r={rem};t={t}",  # type: ignore[union-attr]
    }
    if not d.allowed:  # type: ignore[union-attr]
        s = str(retry_seconds(st))
        h["X-RateLimit-Retry-After"] = s
        h["Retry-After"] = s
    return h


def problem_body(result: CheckResult, status: int = 429) -> str:
    """RFC 9457 problem details naming the rule that denied the request."""
    st = result.report
    assert st is not None and st.rule is not None
    rule = st.rule
    secs = retry_seconds(st)
    if st.source == SRC_CLOSED:
        detail = f"the rate-limit store is unavailable and on_store_failure is 'closed'; retry after {secs} s"
    else:
        detail = f"rate limit {rule.name!r} exceeded ({rule.requests_per_unit} per {rule.unit}); retry after {secs} s"
    return json.dumps(
        {
            "type": "about:blank",
            "title": "Too Many Requests",
            "status": status,
            "detail": detail,
            "rule": rule.name,
            "domain": rule.domain,
            "retry_after": secs,
        },
        separators=(",", ":"),
    )


def simple_problem(status: int, title: str, detail: str) -> str:
    return json.dumps(
        {"type": "about:blank", "title": title, "status": status, "detail": detail}, separators=(",", ":")
    )
