"""What the two packet-filter compilers share (compile.py for iptables,
nft/compile.py for nftables): the values iptables would otherwise pick itself
(netlimit always sets them, so both backends limit alike), netlimit's names, and
the one-line description of a network rule that `plan` prints. Pure."""

from __future__ import annotations

import hashlib
import math

from ..config.model import NetworkRule
from .objects import COMMENT_PREFIX, COMMENT_SEP, LOG_PREFIX_MAX

HASHLIMIT_DEFAULT_BURST = 5  # iptables' own default
HASHLIMIT_DEFAULT_SIZE = 4096
HASHLIMIT_DEFAULT_MAX = 65536
HASHLIMIT_MIN_EXPIRE_MS = 10_000  # iptables' own default
LOG_LIMIT_BURST = "5"  # an `action: log` rule logs at most 10 a minute, 5 at once


def short_name(name: str, room: int) -> str:
    """`name` if it fits in `room` characters, else a prefix + '~' + 5-hex digest."""
    if len(name) <= room:
        return name
    digest = hashlib.sha1(name.encode()).hexdigest()[:5]
    return f"{name[: room - 6]}~{digest}"


def log_prefix(rule_name: str) -> str:
    return COMMENT_PREFIX + short_name(rule_name, LOG_PREFIX_MAX - len(COMMENT_PREFIX) - 1) + " "


def comment_for(rule_name: str, text: str | None = None) -> str:
    """ "netlimit:<rule>", with the rule's `comment:` after " | " when it has one."""
    return COMMENT_PREFIX + rule_name + (COMMENT_SEP + text if text else "")


def burst_of(rule: NetworkRule) -> int:
    return rule.burst if rule.burst is not None else HASHLIMIT_DEFAULT_BURST


def expire_ms(rule: NetworkRule) -> int:
    """How long a per-key bucket outlives its last packet: htable_expire, else the time
    its bucket needs to refill (at least iptables' 10 s), or an idle source would come
    back to a full bucket early."""
    if rule.htable_expire is not None:
        return rule.htable_expire
    assert rule.limit is not None
    refill_ms = math.ceil(1000 * burst_of(rule) * rule.limit.period / rule.limit.count)
    return max(HASHLIMIT_MIN_EXPIRE_MS, refill_ms)


def describe_network(rule: NetworkRule) -> str:
    what: str = rule.protocol if rule.protocol != "all" else "all protocols"
    if rule.ports:
        what += " port " + ",".join(str(p) for p in rule.ports)
    if rule.new_connections:
        what += ", new connections"
    if rule.max_connections is not None:
        lim = f"more than {rule.max_connections} concurrent connections per {rule.per} (connlimit)"
    else:
        lim = f"over {rule.limit} per {rule.per} ({rule.method}"
        if rule.method == "hashlimit":
            lim += f", burst {burst_of(rule)}"
        lim += ")"
    act = {"drop": "drop", "reject": "reject", "log": "log + count, never drop"}[rule.action]
    return f"{what}: {lim} -> {act}"
