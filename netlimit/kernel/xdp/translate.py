"""From the file format to the XDP program's tables (pure): which network rules XDP can
run and, for the others, why not — the reasons `validate` gives for `early: true`.

`refusal` lives with the config (config/early.py: validate asks it); from_config()
takes a predicate choosing the early rules (default: a rule's `early` attribute).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from netlimit.config.early import NO_CONNTRACK, refusal
from netlimit.config.early import port_range as _port_range
from netlimit.config.model import Config, NetworkRule
from netlimit.kernel.network_common import burst_of
from netlimit.kernel.xdp.maps import MAX_RULES, XdpRule

from ...errors import NetlimitError


class EarlyRefused(NetlimitError, ValueError):
    """A rule XDP cannot run; the message names the rule and the reason."""


def early_rules(rule: NetworkRule) -> list[XdpRule]:
    """The XDP rule slots of one network rule (icmp takes two: ICMP and ICMPv6)."""
    why = refusal(rule)
    if why is not None:
        raise EarlyRefused(f"network rule {rule.name!r} cannot be early: {why}")
    assert rule.limit is not None
    every = rule.per == "all"
    base = {
        "limit": rule.limit.count,
        "period_s": float(rule.limit.period),
        "burst": burst_of(rule),
        "dports": _port_range(rule),
        "prefix4": 0 if every else (rule.source_prefix if rule.source_prefix is not None else 32),
        "prefix6": 0 if every else (rule.source_prefix6 if rule.source_prefix6 is not None else 128),
    }
    if rule.protocol == "icmp":
        return [
            XdpRule(rule.name, protocol="icmp", family=4, **base),  # type: ignore[arg-type]
            XdpRule(f"{rule.name}#6", protocol="icmpv6", family=6, **base),  # type: ignore[arg-type]
        ]
    proto = None if rule.protocol == "all" else rule.protocol
    return [XdpRule(rule.name, protocol=proto, **base)]  # type: ignore[arg-type]


@dataclass
class XdpTables:
    """What the XDP program of a host gets from one config."""

    rules: list[XdpRule] = field(default_factory=list)
    slot_rule: list[str] = field(default_factory=list)  # slot -> network rule name (counters)
    exempt: list[str] = field(default_factory=list)
    deny: list[str] = field(default_factory=list)


def from_config(cfg: Config, early: Callable[[NetworkRule], bool] | None = None) -> XdpTables:
    """The XDP tables of `cfg`: its exempt and deny lists, and its early rules (chosen
    by `early`, default a rule's `early` attribute). EarlyRefused names the first rule
    that cannot be early; more than MAX_RULES slots is refused too."""
    pick = early or (lambda r: r.early)
    out = XdpTables(exempt=[str(n) for n in cfg.exempt], deny=[str(n) for n in cfg.deny])
    for rule in cfg.network:
        if not pick(rule):
            continue
        for x in early_rules(rule):
            out.rules.append(x)
            out.slot_rule.append(rule.name)
    if len(out.rules) > MAX_RULES:
        raise EarlyRefused(f"{len(out.rules)} early rule slots; the XDP program holds at most {MAX_RULES}")
    return out


def refusals(rules: Iterable[NetworkRule]) -> dict[str, str]:
    """{rule name: reason} of the rules that could not be early (for validate's message)."""
    return {r.name: why for r in rules if (why := refusal(r)) is not None}


__all__ = ["NO_CONNTRACK", "EarlyRefused", "XdpTables", "early_rules", "from_config", "refusal", "refusals"]
