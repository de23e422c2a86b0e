"""Which network rules may be `early: true` (run in the XDP program, docs/xdp.md) and,
for the others, why not. The config asks it in `validate`; kernel/xdp/translate.py
asks it again before it builds the program's rule table."""

from __future__ import annotations

from .model import NetworkRule

# Why XDP cannot express a feature (it runs in the driver, before conntrack and routing).
NO_CONNTRACK = "XDP runs before conntrack, so it sees packets, not connections"


def port_range(rule: NetworkRule) -> tuple[int, int] | None:
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
    if len(port_range(rule) or ()) == 0 and rule.ports:
        return "ports — an early rule takes one port or one contiguous range"
    return None
