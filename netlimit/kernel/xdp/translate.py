"""From the file format to the XDP program's tables (pure): which network rules XDP can
run and, for the others, why not — the reasons `validate` gives for `early: true`.

Not wired yet: the config has no `early:`/`xdp:` keys in this branch; from_config()
takes a predicate choosing the early rules (default: a rule's `early` attribute).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from netlimit.config.model import Config, NetworkRule
from netlimit.kernel.network_common import burst_of
from netlimit.kernel.xdp.maps import MAX_RULES, XdpRule

from ...errors import NetlimitError

# Why XDP cannot express a feature (it runs in the driver, before conntrack and routing).
NO_CONNTRACK = "XDP runs before conntrack, so it sees packets, not connections"


class EarlyRefused(NetlimitError, ValueError):
    """A rule XDP cannot run; the message names the rule and the reason."""


def refusal(rule: NetworkRule) -> str | None:
    """Why `rule` cannot run in XDP, or None when it can."""
    if rule.method == "recent":
        return f"method: recent counts new connections — {NO_CONNTRACK}"
    if rule.max_connections is not None:
        return f"max_connections (connlimit) counts concurrent connections — {NO_CONNTRACK}"
    if rule.new_connections:
        return f"new_connections needs to tell a new connection from any other packet — {NO_CONNTRACK}"
    if rule.limit is None:
        return "an early rule needs a limit"
    if rule.per not in ("source", "all"):
        return f"per: {rule.per} — the XDP program keys buckets by (masked) source only (per: source | all)"
    if rule.action != "drop":
        return f"action: {rule.action} — XDP can only drop (reject and log need the network stack)"
    if rule.sources or rule.destinations:
        return "sources/destinations filters are not in the XDP program (use exempt/deny, or a normal rule)"
    if rule.chain != "input":
        return f"chain: {rule.chain} — XDP sees every packet arriving on the interface, routed or not"
    if rule.interface is not None:
        return "interface — an early rule applies on every interface in xdp.interfaces"
    if rule.escalate is not None:
        return "escalate — the XDP program does not report drops per source to the daemon (yet)"
    if len(_port_range(rule) or ()) == 0 and rule.ports:
        return "ports — an early rule takes one port or one contiguous range"
    return None


def _port_range(rule: NetworkRule) -> tuple[int, int] | None:
    """The ports as one inclusive range, None when there are no ports, () when the
    ports do not form one contiguous range."""
    if not rule.ports:
        return None
    spans = sorted((p.first, p.last) for p in rule.ports)
    lo, hi = spans[0]
    for a, b in spans[1:]:
        if a > hi + 1:
            return ()  # type: ignore[return-value]
        hi = max(hi, b)
    return lo, hi


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
    pick = early or (lambda r: bool(getattr(r, "early", False)))
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
