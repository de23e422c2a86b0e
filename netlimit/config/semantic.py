"""The checks of a config's meaning that the models cannot express: unique names,
what a network rule's method can count on this kernel, tc bursts, whole-interface
caps, deny against exempt, escalation.  Each check reports through ``add`` (a
problem) or ``warn`` (a warning) with the path of the offending node."""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Callable, Sequence
from typing import Any

from . import kernel_limits as kl
from .early import refusal
from .loader import Document, Problem
from .model import BandwidthRule, Config, Descriptor, NetworkRule
from .units import Rate


def hashlimit_name(rule_name: str) -> str:
    """Kernel hashlimit table name for a rule (<= 15 chars, deterministic, unique)."""
    if len(rule_name) <= kl.HASHLIMIT_NAME_MAX:
        return rule_name
    digest = hashlib.sha1(rule_name.encode()).hexdigest()[:5]
    return f"{rule_name[:9]}~{digest}"


#: how a check reports: add(path, rule, message, key=False) -> None
Add = Callable[..., None]
#: how a check warns: warn(path, rule, message) -> None
Warn = Callable[[tuple[Any, ...], str, str], None]


def semantic(config: Config, doc: Document, filename: str, warnings: list[Problem]) -> list[Problem]:
    """Every problem of meaning in ``config`` (``warnings`` gets the warnings), in the
    order of the checks below (the caller sorts them by position)."""
    out: list[Problem] = []
    limits = kl.host_limits()

    def add(path: tuple[Any, ...], rule: str, message: str, *, key: bool = False) -> None:
        line, col = doc.pos(path, key=key)
        out.append(Problem(filename, line, col, rule, message))

    def warn(path: tuple[Any, ...], rule: str, message: str) -> None:
        line, col = doc.pos(path)
        warnings.append(Problem(filename, line, col, rule, f"warning: {message}"))

    _unique_names(config, doc, add)
    hl_names: dict[str, str] = {}
    for i, r in enumerate(config.network):
        _network_rule(r, ("network", i), doc, limits, hl_names, add, warn)
    for i, b in enumerate(config.bandwidth):
        _bandwidth_rule(b, ("bandwidth", i), limits.hz, add)
    _escalation(config, doc, add)
    _deny(config, doc, add)
    _whole_interface_caps(config, add)
    _early(config, add)
    return out


def _early(config: Config, add: Add) -> None:
    """`early: true` needs an `xdp:` section and a rule the XDP program can run."""
    for i, r in enumerate(config.network):
        if not r.early:
            continue
        if config.xdp is None:
            add(("network", i, "early"), r.name, "early: true needs a top-level `xdp:` section (its interfaces)")
            continue
        why = refusal(r)
        if why is not None:
            add(("network", i, "early"), r.name, f"early: true cannot run in XDP: {why}")


def _unique_names(config: Config, doc: Document, add: Add) -> None:
    """A rule name is used once across network and bandwidth."""
    names: dict[str, tuple[str, int]] = {}
    sections: tuple[tuple[str, Sequence[NetworkRule | BandwidthRule]], ...] = (
        ("network", config.network),
        ("bandwidth", config.bandwidth),
    )
    for section, rules in sections:
        for i, rule in enumerate(rules):
            where = (section, i, "name")
            if rule.name in names:
                sec0, i0 = names[rule.name]
                line0 = doc.pos((sec0, i0, "name"))[0]
                add(
                    where,
                    rule.name,
                    f"duplicate rule name (first used at line {line0}); names must be unique "
                    "across network and bandwidth",
                )
            else:
                names[rule.name] = (section, i)


def _network_rule(
    r: NetworkRule,
    p: tuple[Any, ...],
    doc: Document,
    limits: kl.KernelLimits,
    hl_names: dict[str, str],
    add: Add,
    warn: Warn,
) -> None:
    """One network rule: what it matches, then what its method can count."""
    _network_match(r, p, add)
    if r.max_connections is not None:
        _connlimit(r, p, "method" in doc.data["network"][p[1]], add)
        return
    assert r.limit is not None
    if r.method == "recent":
        _recent(r, p, limits, add, warn)
    else:
        _hashlimit(r, p, hl_names, add)


def _network_match(r: NetworkRule, p: tuple[Any, ...], add: Add) -> None:
    """Ports, connections and address families a packet could actually have."""
    if r.ports and r.protocol not in ("tcp", "udp"):
        add(p + ("ports",), r.name, f"ports need protocol: tcp or udp (protocol is {r.protocol})")
    if r.new_connections and r.protocol not in ("tcp", "all", "udp"):
        add(
            p + ("new_connections",),
            r.name,
            f"new_connections counts TCP/UDP connections; protocol {r.protocol} has none",
        )
    fams = r.families
    if r.source_prefix is not None and 4 not in fams:
        add(
            p + ("source_prefix",),
            r.name,
            "source_prefix is for IPv4 but this rule only matches IPv6 addresses: use source_prefix6",
        )
    if r.source_prefix6 is not None and 6 not in fams:
        add(
            p + ("source_prefix6",),
            r.name,
            "source_prefix6 is for IPv6 but this rule only matches IPv4 addresses: use source_prefix",
        )
    srcs, dsts = r.sources, r.destinations
    if srcs and dsts and not ({n.version for n in srcs} & {n.version for n in dsts}):
        add(
            p + ("destinations",),
            r.name,
            "sources and destinations are of different IP families: no packet can match both",
        )


def _connlimit(r: NetworkRule, p: tuple[Any, ...], method_written: bool, add: Add) -> None:
    """A max_connections rule (connlimit): the 'limit' rules' fields do not apply."""
    if r.method != "hashlimit" and method_written:
        add(p + ("method",), r.name, "method applies to 'limit' rules; max_connections uses connlimit")
    if r.burst is not None:
        add(p + ("burst",), r.name, "burst applies to 'limit' rules, not max_connections")
    if r.per in ("source+port",):
        add(
            p + ("per",),
            r.name,
            "max_connections counts per source, destination or all; 'source+port' is not possible with connlimit",
        )
    if r.protocol not in ("tcp", "udp"):
        add(p + ("protocol",), r.name, "max_connections needs protocol: tcp (or udp)")


def _recent(r: NetworkRule, p: tuple[Any, ...], limits: kl.KernelLimits, add: Add, warn: Warn) -> None:
    """method: recent: a hit log per address, at most this kernel's hitcount."""
    rate = r.limit
    assert rate is not None
    if rate.count > limits.recent_max_hitcount:
        add(
            p + ("limit",),
            r.name,
            f"method: recent can count at most {limits.recent_max_hitcount} hits per address "
            f"({limits.recent_source}); {rate} needs more: use method: hashlimit",
        )
    if r.per not in ("source", "destination"):
        add(
            p + ("per",),
            r.name,
            f"method: recent tracks one address per entry: per must be source or "
            f"destination, not {r.per} (use method: hashlimit)",
        )
    if r.burst is not None:
        add(p + ("burst",), r.name, "method: recent has no burst: it allows exactly N per window")
    if r.source_prefix is not None or r.source_prefix6 is not None:
        add(p + ("method",), r.name, "method: recent cannot group sources by prefix: use method: hashlimit")
    if not r.new_connections:
        warn(
            p + ("method",),
            r.name,
            "method: recent without new_connections: true counts every "
            "packet as a hit (fine for e.g. pings; for connections set "
            "new_connections: true)",
        )
    for fld in ("htable_size", "htable_max", "htable_expire"):
        if getattr(r, fld) is not None:
            add(p + (fld,), r.name, f"{fld} applies to method: hashlimit only")


def _hashlimit(r: NetworkRule, p: tuple[Any, ...], hl_names: dict[str, str], add: Add) -> None:
    """method: hashlimit: a rate it can express, a burst it takes, a table name of its own."""
    rate = r.limit
    assert rate is not None
    for fld in ("source_prefix", "source_prefix6"):
        if getattr(r, fld) is not None and r.per not in ("source", "source+port"):
            add(
                p + (fld,),
                r.name,
                f"{fld} groups sources, but per is {r.per}: use per: source (or source+port)",
            )
    if rate.exact() is None:
        add(
            p + ("limit",),
            r.name,
            f"hashlimit counts per second, minute, hour or day: {rate} is not a "
            "whole number per any of them; pick another rate or use method: recent",
        )
    elif rate.per_second > kl.HASHLIMIT_MAX_PER_SECOND:
        add(
            p + ("limit",),
            r.name,
            f"{rate} is faster than hashlimit can express (at most {kl.HASHLIMIT_MAX_PER_SECOND}/second)",
        )
    elif rate.period / rate.count > kl.HASHLIMIT_MAX_INTERVAL_S:
        add(
            p + ("limit",),
            r.name,
            f"{rate} is slower than hashlimit can express (at least one per "
            f"{int(kl.HASHLIMIT_MAX_INTERVAL_S)} s, e.g. 1/hour or 21/day); "
            "for new connections use method: recent",
        )
    if r.burst is not None and r.burst > kl.HASHLIMIT_BURST_MAX:
        add(p + ("burst",), r.name, f"burst {r.burst} is above hashlimit's maximum {kl.HASHLIMIT_BURST_MAX}")
    hl = hashlimit_name(r.name)
    if hl in hl_names:
        add(p + ("name",), r.name, f"hashlimit table name {hl!r} collides with rule {hl_names[hl]!r}")
    hl_names[hl] = r.name
    if r.htable_max is not None and r.htable_size is not None and r.htable_max < r.htable_size:
        add(p + ("htable_max",), r.name, "htable_max must be at least htable_size")


def _bandwidth_rule(b: BandwidthRule, p: tuple[Any, ...], hz: int, add: Add) -> None:
    """A tc burst that reaches the cap at this kernel's HZ; protocol only with ports."""
    if b.burst is not None:
        need = kl.min_tc_burst(b.rate, hz)
        if b.burst < need:
            add(
                p + ("burst",),
                b.name,
                f"burst {b.burst} bytes is below one MTU-sized frame per timer tick at this rate "
                f"({need} bytes at HZ={hz}); the cap would not be reached. Raise it or omit burst "
                f"(default {kl.default_tc_burst(b.rate, hz)} bytes)",
            )
    if b.protocol != "all" and not b.ports:
        add(p + ("protocol",), b.name, "protocol only narrows port matches: add ports or drop protocol")


def _whole_interface_caps(config: Config, add: Add) -> None:
    """Whole-interface caps: at most one per interface and direction."""
    seen_whole: dict[tuple[str, str], str] = {}
    for i, b in enumerate(config.bandwidth):
        if b.whole_interface:
            k = (b.interface, b.direction)
            if k in seen_whole:
                add(
                    ("bandwidth", i, "interface"),
                    b.name,
                    f"{b.direction} on {b.interface} already has a whole-interface rate in rule "
                    f"{seen_whole[k]!r}: one interface has one cap per direction",
                )
            seen_whole[k] = b.name


# --- deny ------------------------------------------------------------------------


def _deny(config: Config, doc: Document, add: Any) -> None:
    """A deny entry overlapping an exempt one is refused: exempt is matched first, so the
    overlap would be silently allowed (or, the other way round, an exempt host dropped)."""
    for i, net in enumerate(config.deny):
        for j, ex in enumerate(config.exempt):
            if net.version == ex.version and (net.subnet_of(ex) or net.supernet_of(ex)):  # type: ignore[arg-type]
                line = doc.pos(("exempt", j))[0]
                add(
                    ("deny", i),
                    "deny",
                    f"{net} overlaps exempt {ex} (line {line}): exempt is matched first, so the overlap would "
                    "never be dropped; remove one of them",
                )
                break


# --- escalation ------------------------------------------------------------------


def _covered(net: Any, by: Sequence[Any]) -> bool:
    return any(net.version == n.version and net.subnet_of(n) for n in by)


def _escalation(config: Config, doc: Document, add: Any) -> None:
    """What the models cannot see about `escalate` and `bans:`: a rule must be able to
    deny and to name a client, and must be able to ban someone who is neither exempt
    nor a trusted proxy (those are never banned)."""
    exempt = list(config.exempt)
    proxies = list(config.http.trusted_proxies) if config.http is not None else []
    for i, r in enumerate(config.network):
        esc = r.escalate
        if esc is None:
            continue
        p = ("network", i, "escalate")
        if r.action == "log":
            add(p, r.name, "escalate needs a rule that drops or rejects: action: log never denies, so never bans")
        if Rate(esc.after, "second", esc.within).exact() is None:
            add(
                p + ("within",),
                r.name,
                f"the kernel counts over-limit packets as a whole number per second, minute, hour or day: "
                f"{esc.after} within {esc.within} s is none of them (e.g. within: 1m)",
            )
        if r.sources and all(_covered(n, exempt) for n in r.sources):
            add(p, r.name, "escalate could only ban exempt addresses (every source of this rule is in exempt:)")
    for path, d in _descriptor_paths(config):
        esc = d.escalate
        if esc is None:
            continue
        keys = [k for k, _v in path[1]]
        where = path[0] + ("escalate",)
        if d.rate_limit is None:
            add(where, "http", "escalate needs a descriptor with rate_limit: it counts this limit's denials")
        elif d.shadow_mode:
            add(where, "http", "escalate on a shadow_mode descriptor never fires: shadow rules never deny")
        if "remote_address" not in keys:
            add(
                where,
                "http",
                "escalate bans the client's address: this descriptor (or one above it) needs key remote_address",
            )
            continue
        value = next(v for k, v in reversed(path[1]) if k == "remote_address")
        if value and not value.endswith("*"):
            try:
                addr = ipaddress.ip_network(value, strict=False)
            except ValueError:
                continue
            if _covered(addr, exempt) or _covered(addr, proxies):
                add(
                    where,
                    "http",
                    f"escalate could only ban {value}, which is exempt or a trusted proxy (never banned)",
                )


def _descriptor_paths(config: Config) -> list[tuple[tuple[tuple[Any, ...], list[tuple[str, str | None]]], Descriptor]]:
    """Each descriptor with (its position in the file, the (key, value) entries from the root)."""
    out: list[tuple[tuple[tuple[Any, ...], list[tuple[str, str | None]]], Descriptor]] = []

    def walk(descs: list[Descriptor], where: tuple[Any, ...], entries: list[tuple[str, str | None]]) -> None:
        for i, d in enumerate(descs):
            here = where + ("descriptors", i)
            e = entries + [(d.key, d.value)]
            out.append(((here, e), d))
            walk(d.descriptors, here, e)

    if config.http is not None:
        walk(config.http.descriptors, ("http",), [])
    return out
