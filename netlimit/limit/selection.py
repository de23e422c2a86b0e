"""Rule selection and Lyft's counting: the one home every door and ``simulate`` call.

Which rule decides each descriptor of a request (:func:`select`: the rule the
descriptor matches in :meth:`RuleSet.match`, then ``replaces`` applied as
Lyft's ``constructLimitsToCheck``), the rule a descriptor's limit override
stands for (:func:`override_rule`), and how a decision is counted in a rule's
per-stat-key counters (:func:`count_value`, :func:`stats_near`).  The
:class:`~netlimit.limit.limiter.Limiter` (and so the gRPC, HTTP and JSON doors)
and ``netlimit simulate`` (simulate/replay.py) pick rules through :func:`select`
only; tests/simulate/test_sim_parity.py holds the two to the same per-rule
decisions on a live sidecar.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from ..config.model import UNIT_SECONDS
from .algorithms import DEFAULT_ALGORITHM, Decision, DynamicLimit
from .request import Override
from .rules import Entry, Rule, RuleSet, RuleStats, sf_string


def select(rs: RuleSet, descriptors: Sequence[Sequence[Entry]]) -> list[Rule | None]:
    """The rule deciding each descriptor (None: no rule), ``replaces`` applied."""
    match = rs.match
    rules = [match(d) for d in descriptors]
    return replace(rules) if rs.has_replaces else rules


def replace(rules: list[Rule | None]) -> list[Rule | None]:
    """``rules`` without those a matched rule's ``replaces`` names (by
    ``rate_limit.name``; unlimited rules and overrides are never replaced), as
    Lyft's ``constructLimitsToCheck``."""
    replaced = {n for r in rules if r is not None for n in r.replaces}
    if not replaced:
        return rules
    return [None if r is not None and r.lyft_name in replaced and r.limit is not None else r for r in rules]


def quota_count(rs: RuleSet, rules: Sequence[Rule | None]) -> int:
    """How many of a request's descriptors are quota ones (Lyft's quota_mode), given
    the rule deciding each (:func:`select`): with ``http.quota_mode`` every
    descriptor but an unlimited rule's, else those whose rule has ``quota_mode``."""
    if rs.quota_mode:
        return sum(1 for r in rules if r is None or not r.unlimited)
    return sum(1 for r in rules if r is not None and r.limit is not None and r.quota)


def answer_over(over: int, quotas: int, quota_over: int) -> bool:
    """Whether a request is over the limit: an enforced (non-shadow) non-quota rule
    denied it (``over`` such denials), or every one of its ``quotas`` quota
    descriptors is over its limit (``quota_over`` enforced denials among them).
    ``http.shadow_mode`` then answers OK all the same (the caller's part)."""
    return over > 0 or (quotas > 0 and quota_over == quotas)


def stats_near(rule: Rule, dec: Decision, cost: int) -> int:
    """The hits of an allowed decision past the rule's near-limit threshold."""
    n = rule.near_threshold - dec.remaining + 1
    return 0 if n <= 0 else cost if cost < n else n


def count_value(vs: RuleStats, cost: int, allowed: bool, near: int, shadow: bool) -> None:
    """Count a decision in a rule's per-stat-key counters (RuleSet.value_stats)."""
    vs.hits += cost
    if allowed:
        vs.within += cost
        vs.near += near
    else:
        vs.over += cost
        if shadow:
            vs.shadow += cost


#: at most this many override rules are cached, least recently used dropped first
#: (they are built from request data)
_OVERRIDE_CACHE_MAX = 1024


def _override_tag(keys: tuple[str, ...]) -> str:
    """The descriptor keys in an override's counter key prefix, injective: clients
    choose the keys, so each one is escaped (``\\`` -> ``\\\\``, ``|`` -> ``\\p``,
    the separator -> ``\\s``) before they are joined, and no tag holds a bare
    ``|`` (the prefix ends at the first one after it).  A long tag becomes ``\\h`` +
    a BLAKE2b digest: an escaped tag never starts with ``\\h``."""
    tag = "\x1f".join(k.replace("\\", "\\\\").replace("|", "\\p").replace("\x1f", "\\s") for k in keys)
    if len(tag) > 64:
        tag = "\\h" + hashlib.blake2b(tag.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
    return tag


def override_rule(domain: str, keys: tuple[str, ...], ov: Override, matched: Rule | None) -> Rule:
    """The rule a descriptor's ``limit`` override stands for."""
    period = UNIT_SECONDS[ov.unit] * ov.multiplier
    algorithm, delay = DEFAULT_ALGORITHM, False
    if matched is not None and matched.limit is not None:
        algorithm, delay = matched.algorithm, matched.limit.delay
    per = f"{ov.multiplier} {ov.unit}s" if ov.multiplier > 1 else ov.unit
    name = f"override {ov.requests_per_unit} per {per}"
    # the Limit's name keeps override state apart from configured rules' state; a
    # DynamicLimit keeps nothing outside itself (one namespace and one Redis script per
    # algorithm for every override), so a client's distinct overrides cost nothing once
    # the Limiter's override cache lets go of them
    limit = DynamicLimit(
        algorithm=algorithm, limit=ov.requests_per_unit, period=float(period), burst=None, delay=delay, name=name
    )
    path = ".".join(keys)
    tag = _override_tag(keys)
    sfn = sf_string(name)
    return Rule(
        name=name,
        path=f"override:{path}",
        domain=domain,
        keys=keys,
        unit=ov.unit,
        requests_per_unit=ov.requests_per_unit,
        period=period,
        algorithm=algorithm,
        limit=limit,
        key_prefix=f"{domain}|~override {ov.requests_per_unit}/{period}s {algorithm}|{tag}|",
        sf_name=sfn,
        policy=f"{sfn};q={ov.requests_per_unit};w={period}",
        near_threshold=limit.capacity - (4 * limit.capacity + 4) // 5,
        # counted with the configured rule it overrides, if any (metric labels stay
        # bounded by the configuration); otherwise not per rule
        stats=matched.stats if matched is not None else RuleStats(),
        multiplier=ov.multiplier,
    )
