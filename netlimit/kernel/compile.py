"""Config model -> desired kernel objects. Pure: no kernel access, no root.

`compile_config(config, hz=...)` is the one function both `netlimit plan` and
the kernel backends call. Its output (objects.py) is deterministic: the same
file and HZ give the same objects, names and handles.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterable
from typing import Any

from ..config import kernel_limits as kl
from ..config.model import BandwidthRule, Config, NetworkRule
from ..config.units import PortRange, Rate, format_bandwidth
from ..config.validate import hashlimit_name
from .listing import summarize
from .network_common import (
    HASHLIMIT_DEFAULT_MAX,
    HASHLIMIT_DEFAULT_SIZE,
    LOG_LIMIT_BURST,
    burst_of,
    comment_for,
    describe_network,
    expire_ms,
    log_prefix,
    short_name,
)
from .nft import ingress as nft_ingress
from .nft.compile import compile_nft
from .objects import (
    CHAIN_FORWARD,
    CHAIN_INPUT,
    CHAIN_MAX,
    CHAIN_PREFIX,
    COMMENT_BANS,
    COMMENT_DENY,
    COMMENT_EXEMPT,
    COMMENT_JUMP,
    IFB_PREFIX,
    IPSET_BAN_SETS,
    IPSET_KERNEL_BAN_PREFIX,
    IPSET_NAME_MAX,
    LOG_CHAIN_PREFIX,
    TC_INGRESS_PRIO,
    TC_MAJOR,
    TC_MINOR_DEFAULT,
    TC_MINOR_FIRST_RULE,
    TC_MINOR_TOP,
    UNLIMITED_BITS,
    Desired,
    Device,
    IpSet,
    IptChain,
    IptRule,
    Match,
    TcClass,
    TcFilter,
    TcLink,
    TcObject,
    TcQdisc,
    U32Key,
    tc_handle,
)
from .xdp.stage import compile_xdp

TABLE = "filter"
LOG_LIMIT = "10/min"  # an `action: log` rule logs at most this often (burst: LOG_LIMIT_BURST)
MULTIPORT_MAX = 15  # entries per multiport match (a range counts 2)

_RATE_UNIT = {"second": "sec", "minute": "min", "hour": "hour", "day": "day"}
_PROTO_NUM = {"tcp": 6, "udp": 17}


# --- names ------------------------------------------------------------------------


def log_chain_name(rule_name: str) -> str:
    return LOG_CHAIN_PREFIX + short_name(rule_name, CHAIN_MAX - len(LOG_CHAIN_PREFIX))


ESCALATE_CHAIN_PREFIX = f"{CHAIN_PREFIX}-X-"  # NETLIMIT-X-<rule>: an escalating rule's packets over its limit


def escalate_chain_name(rule_name: str) -> str:
    return ESCALATE_CHAIN_PREFIX + short_name(rule_name, CHAIN_MAX - len(ESCALATE_CHAIN_PREFIX))


def kernel_ban_ipset(rule_name: str, family: int) -> str:
    """The ipset a network rule's escalation adds sources to (<= 31 characters)."""
    head = f"{IPSET_KERNEL_BAN_PREFIX}{family}-"
    return head + short_name(rule_name, IPSET_NAME_MAX - len(head))


def escalate_hashlimit_name(rule_name: str) -> str:
    """The hashlimit table that counts an escalating rule's over-limit packets per source
    ('~' never appears in a rule name, so it never collides with a rule's own table)."""
    return "x~" + hashlib.sha1(rule_name.encode()).hexdigest()[:12]


def ifb_name(interface: str) -> str:
    """IFB device for ingress shaping of `interface` (<= 15 characters, deterministic)."""
    return IFB_PREFIX + short_name(interface, 15 - len(IFB_PREFIX))


# --- iptables ---------------------------------------------------------------------


def _ipt_rate(count: int, unit: str) -> str:
    return f"{count}/{_RATE_UNIT[unit]}"


def _multiport_chunks(ports: list[PortRange]) -> list[str]:
    """Split ports into multiport-sized groups ('22,80,8000:8100')."""
    chunks: list[str] = []
    cur: list[str] = []
    used = 0
    for p in sorted(set(ports)):
        cost = 1 if p.first == p.last else 2
        if used + cost > MULTIPORT_MAX:
            chunks.append(",".join(cur))
            cur, used = [], 0
        cur.append(p.iptables)
        used += cost
    if cur:
        chunks.append(",".join(cur))
    return chunks


def _fam_nets(nets: Iterable, family: int) -> list[str | None]:
    """A rule's CIDRs of one family; a /0 matches everything and is written as no -s/-d."""
    return [str(n) if n.prefixlen else None for n in nets if n.version == family]


def _protocol(rule: NetworkRule, family: int) -> str | None:
    if rule.protocol == "all":
        return None
    if rule.protocol == "icmp":
        return "icmp" if family == 4 else "ipv6-icmp"
    return rule.protocol


def _host_mask(family: int, prefix: int | None) -> str:
    bits = 32 if family == 4 else 128
    plen = bits if prefix is None else prefix
    net = ipaddress.ip_network(f"{'0.0.0.0' if family == 4 else '::'}/{plen}")
    return str(net.netmask)


def _target(rule: NetworkRule, family: int, escalating: bool = True) -> tuple[str, tuple[tuple[str, str | None], ...]]:
    if escalating and rule.escalate is not None:
        return escalate_chain_name(rule.name), ()
    if rule.action == "drop":
        return "DROP", ()
    if rule.action == "reject":
        if rule.protocol == "tcp":
            return "REJECT", (("reject-with", "tcp-reset"),)
        return "REJECT", (("reject-with", "icmp-port-unreachable" if family == 4 else "icmp6-port-unreachable"),)
    return log_chain_name(rule.name), ()


def _limit_match(rule: NetworkRule, family: int) -> list[Match]:
    """The match(es) that decide 'over the limit' (the rule's target then fires)."""
    prefix = rule.source_prefix if family == 4 else rule.source_prefix6
    if rule.max_connections is not None:
        opts: list[tuple[str, str | None]] = [("connlimit-above", str(rule.max_connections))]
        if rule.per == "all":
            opts.append(("connlimit-mask", "0"))
        else:
            bits = 32 if family == 4 else 128
            opts.append(("connlimit-mask", str(bits if prefix is None else prefix)))
        opts.append(("connlimit-daddr" if rule.per == "destination" else "connlimit-saddr", None))
        return [Match("connlimit", tuple(opts))]
    assert rule.limit is not None
    rate = rule.limit
    if rule.method == "recent":
        return [
            Match(
                "recent",
                (
                    ("update", None),
                    ("seconds", str(rate.period)),
                    ("hitcount", str(rate.count)),
                    ("name", rule.name),
                    ("mask", _host_mask(family, None)),
                    ("rdest" if rule.per == "destination" else "rsource", None),
                ),
            )
        ]
    burst = burst_of(rule)
    size = rule.htable_size if rule.htable_size is not None else HASHLIMIT_DEFAULT_SIZE
    hmax = rule.htable_max if rule.htable_max is not None else max(HASHLIMIT_DEFAULT_MAX, size)
    expire = expire_ms(rule)
    mode = {"source": "srcip", "destination": "dstip", "source+port": "srcip,dstport", "all": None}[rule.per]
    exact = rate.exact()
    assert exact is not None, "validate rejects rates hashlimit cannot express"
    opts = [("hashlimit-above", _ipt_rate(*exact)), ("hashlimit-burst", str(burst))]
    if mode:
        opts.append(("hashlimit-mode", mode))
    opts += [
        ("hashlimit-name", hashlimit_name(rule.name)),
        ("hashlimit-htable-size", str(size)),
        ("hashlimit-htable-max", str(hmax)),
        ("hashlimit-htable-expire", str(expire)),
    ]
    if prefix is not None and mode and "srcip" in mode:
        opts.append(("hashlimit-srcmask", str(prefix)))
    return [Match("hashlimit", tuple(opts))]


def _network_rules(rule: NetworkRule, family: int, chain: str) -> list[IptRule]:
    srcs = _fam_nets(rule.sources, family) if rule.sources else [None]
    dsts = _fam_nets(rule.destinations, family) if rule.destinations else [None]
    if not srcs or not dsts:
        return []
    proto = _protocol(rule, family)
    ports = _multiport_chunks(rule.ports) if rule.ports else [None]
    new = rule.new_connections or rule.max_connections is not None
    target, topts = _target(rule, family)
    limit = _limit_match(rule, family)
    out: list[IptRule] = []
    note = describe_network(rule)
    for s in srcs:
        for d in dsts:
            for pchunk in ports:
                base: list[Match] = []
                if pchunk is not None:
                    base.append(Match("multiport", (("dports", pchunk),)))
                if new:
                    base.append(Match("conntrack", (("ctstate", "NEW"),)))
                common: dict[str, Any] = dict(
                    family=family,
                    table=TABLE,
                    chain=chain,
                    rule=rule.name,
                    comment=comment_for(rule.name, rule.comment),
                    src=s,
                    dst=d,
                    in_iface=rule.interface,
                    protocol=proto,
                )
                out.append(
                    IptRule(**common, matches=tuple(base + limit), target=target, target_options=topts, note=note)
                )
                if rule.method == "recent" and rule.max_connections is None:
                    # the counting half: remember this source (after the check above)
                    rec = limit[0]
                    set_opts = (("set", None),) + tuple(
                        o for o in rec.options if o[0] in ("name", "mask", "rsource", "rdest")
                    )
                    out.append(
                        IptRule(
                            **common,
                            matches=tuple(base + [Match("recent", set_opts)]),
                            target=None,
                            note="remember the source for the check above",
                        )
                    )
    return out


def _log_chain_rules(rule: NetworkRule, family: int) -> list[IptRule]:
    return [
        IptRule(
            family=family,
            table=TABLE,
            chain=log_chain_name(rule.name),
            rule=rule.name,
            comment=comment_for(rule.name, rule.comment),
            matches=(Match("limit", (("limit", LOG_LIMIT), ("limit-burst", LOG_LIMIT_BURST))),),
            target="LOG",
            target_options=(("log-prefix", log_prefix(rule.name)),),
            note="shadow mode: log (rate-limited) and return; the jump above counts every packet over the limit",
        )
    ]


def _escalate_chain_rules(rule: NetworkRule, family: int) -> list[IptRule]:
    """An escalating rule's chain: count the source's over-limit packets (hashlimit:
    `after` per `within`, burst `after`, per source prefix) and, over that, add the
    prefix to the rule's ipset (its default timeout is the ban); then the action."""
    esc = rule.escalate
    assert esc is not None
    exact = Rate(esc.after, "second", esc.within).exact()
    assert exact is not None, "validate refuses a `within` no whole rate expresses"
    chain = escalate_chain_name(rule.name)
    opts: list[tuple[str, str | None]] = [
        ("hashlimit-above", _ipt_rate(*exact)),
        ("hashlimit-burst", str(esc.after)),
        ("hashlimit-mode", "srcip"),
        ("hashlimit-name", escalate_hashlimit_name(rule.name)),
        ("hashlimit-htable-expire", str(esc.within * 1000)),
        ("hashlimit-srcmask", str(esc.prefix(family))),
    ]
    common: dict[str, Any] = dict(
        family=family, table=TABLE, chain=chain, rule=rule.name, comment=comment_for(rule.name, rule.comment)
    )
    target, topts = _target(rule, family, escalating=False)
    return [
        IptRule(
            **common,
            matches=(Match("hashlimit", tuple(opts)),),
            target="SET",
            target_options=(("add-set", f"{kernel_ban_ipset(rule.name, family)} src"),),
            note=f"escalate: {esc.after} over-limit packets within {esc.within} s -> ban the source's "
            f"/{esc.prefix(family)} for {esc.ban} s",
        ),
        IptRule(**common, target=target, target_options=topts, note=describe_network(rule)),
    ]


def _deny_rules(config: Config, family: int, chain: str) -> list[IptRule]:
    """After exempt, before the bans: drop the file's static `deny:` list, one rule per
    prefix (overlaps merged)."""
    from .nft.compile import deny_nets

    return [
        IptRule(
            family=family,
            table=TABLE,
            chain=chain,
            rule="",
            comment=COMMENT_DENY,
            src=str(net),
            target="DROP",
            note="deny: always dropped",
        )
        for net in deny_nets(config, family)
    ]


def _ban_rules(config: Config, family: int, chain: str) -> list[IptRule]:
    """After exempt, before every limit: drop the sources of the ban list and of the
    rules' own escalation."""
    if not config.bans_on:
        return []
    sets = [(IPSET_BAN_SETS[family], "banned (netlimit ban list)")]
    sets += [
        (kernel_ban_ipset(r.name, family), f"banned by rule {r.name}")
        for r in config.network
        if r.escalate is not None and family in r.families
    ]
    return [
        IptRule(
            family=family,
            table=TABLE,
            chain=chain,
            rule="",
            comment=COMMENT_BANS,
            matches=(Match("set", (("match-set", f"{name} src"),)),),
            target="DROP",
            note=note,
        )
        for name, note in sets
    ]


def compile_ipsets(config: Config) -> list[IpSet]:
    """The ipsets the legacy backends need: the ban list's and each escalating rule's."""
    if not config.bans_on:
        return []
    out = [IpSet(IPSET_BAN_SETS[f], "hash:net", f, config.max_bans, 0) for f in (4, 6)]
    for r in config.network:
        esc = r.escalate
        if esc is None:
            continue
        for f in r.families:
            out.append(
                IpSet(kernel_ban_ipset(r.name, f), "hash:ip", f, config.max_bans, esc.ban, esc.prefix(f), r.name)
            )
    return out


def compile_network(config: Config) -> tuple[list[IptChain], list[IptRule]]:
    chains: list[IptChain] = []
    rules: list[IptRule] = []
    for family in (4, 6):
        exempt = [str(n) for n in config.exempt if n.version == family]
        per_chain: dict[str, list[IptRule]] = {}
        log_rules: list[tuple[IptChain, list[IptRule]]] = []
        for r in config.network:
            if family not in r.families:
                continue
            chain = CHAIN_INPUT if r.chain == "input" else CHAIN_FORWARD
            body = _network_rules(r, family, chain)
            if not body:
                continue
            per_chain.setdefault(chain, []).extend(body)
            if r.action == "log":
                log_rules.append((IptChain(family, TABLE, log_chain_name(r.name), r.name), _log_chain_rules(r, family)))
            if r.escalate is not None:
                ch = IptChain(family, TABLE, escalate_chain_name(r.name), r.name)
                log_rules.append((ch, _escalate_chain_rules(r, family)))
        if (config.bans_on or config.deny) and not per_chain:
            per_chain[CHAIN_INPUT] = []  # bans or deny alone: dropped on input
        for chain in (CHAIN_INPUT, CHAIN_FORWARD):
            if chain not in per_chain:
                continue
            chains.append(IptChain(family, TABLE, chain, ""))
            for cidr in exempt:
                rules.append(
                    IptRule(
                        family=family,
                        table=TABLE,
                        chain=chain,
                        rule="",
                        comment=COMMENT_EXEMPT,
                        src=cidr,
                        target="RETURN",
                        note="exempt: never limited",
                    )
                )
            rules.extend(_deny_rules(config, family, chain))
            rules.extend(_ban_rules(config, family, chain))
            rules.extend(per_chain[chain])
        for ch, body in log_rules:
            chains.append(ch)
            rules.extend(body)
        for chain, builtin in ((CHAIN_INPUT, "INPUT"), (CHAIN_FORWARD, "FORWARD")):
            if chain in per_chain:
                rules.append(
                    IptRule(
                        family=family,
                        table=TABLE,
                        chain=builtin,
                        rule="",
                        comment=COMMENT_JUMP,
                        target=chain,
                        position=0,
                        note=f"jump from {builtin} (first rule)",
                    )
                )
    return chains, rules


# --- tc -----------------------------------------------------------------------------


def _quantum(rate_bits: int) -> int:
    """HTB quantum: rate/10 (tc's r2q) kept between one frame and 60000 bytes."""
    return int(min(max(rate_bits // 8 // 10, kl.ETH_FRAME), 60000))


def _port_blocks(p: PortRange) -> list[tuple[int, int]]:
    """A port range as (value, mask) blocks a u32 match can express."""
    out: list[tuple[int, int]] = []
    lo, hi = p.first, p.last
    while lo <= hi:
        size = lo & -lo if lo else 1 << 16
        while size > hi - lo + 1:
            size >>= 1
        out.append((lo, (0xFFFF & ~(size - 1))))
        lo += size
    return out


def _addr_keys(net: ipaddress.IPv4Network | ipaddress.IPv6Network, which: str) -> list[U32Key]:
    if net.version == 4:
        off = 12 if which == "src" else 16
        if net.prefixlen == 0:
            return []
        return [U32Key(int(net.network_address), int(net.netmask), off)]
    base = 8 if which == "src" else 24
    addr = int(net.network_address).to_bytes(16, "big")
    mask = int(net.netmask).to_bytes(16, "big")
    keys = []
    for i in range(4):
        m = int.from_bytes(mask[4 * i : 4 * i + 4], "big")
        if m:
            keys.append(U32Key(int.from_bytes(addr[4 * i : 4 * i + 4], "big"), m, base + 4 * i))
    return keys


def _proto_key(family: int, proto: str) -> U32Key:
    if family == 4:
        return U32Key(_PROTO_NUM[proto] << 16, 0x00FF0000, 8)
    return U32Key(_PROTO_NUM[proto] << 8, 0x0000FF00, 4)


def _port_key(family: int, port_field: str, value: int, mask: int) -> U32Key:
    off = 20 if family == 4 else 40  # no IPv4 options / IPv6 extension headers
    if port_field == "sport":
        return U32Key(value << 16, mask << 16, off)
    return U32Key(value, mask, off)


def _describe_bw(b: BandwidthRule) -> str:
    parts = [f"{b.direction} {b.interface}"]
    if b.ports:
        parts.append(
            f"{b.protocol if b.protocol != 'all' else 'tcp+udp'} "
            f"{'sport' if b.direction == 'egress' else 'dport'} " + ",".join(str(p) for p in b.ports)
        )
    if b.sources:
        parts.append(("to " if b.direction == "egress" else "from ") + ",".join(str(s) for s in b.sources))
    if b.whole_interface:
        parts.append("whole interface")
    return ", ".join(parts) + f": {format_bandwidth(b.rate)}"


def _filters_for(b: BandwidthRule, dev: str, parent: int, flowid: int, index: int) -> list[TcFilter]:
    out: list[TcFilter] = []
    port_field = "sport" if b.direction == "egress" else "dport"
    addr_field = "dst" if b.direction == "egress" else "src"
    fams = sorted({n.version for n in b.sources}) or [4, 6]
    protos = [b.protocol] if b.protocol != "all" else (["tcp", "udp"] if b.ports else [None])
    note = _describe_bw(b)
    for fam in fams:
        nets: list[ipaddress.IPv4Network | ipaddress.IPv6Network | None] = [
            n for n in b.sources if n.version == fam
        ] or [None]
        prio = (index + 1) * 10 + (0 if fam == 4 else 1)
        for net in nets:
            akeys = _addr_keys(net, addr_field) if net is not None else []
            for proto in protos:
                pkeys = [_proto_key(fam, proto)] if proto else []
                blocks = [blk for p in b.ports for blk in _port_blocks(p)] if b.ports else [None]
                for blk in blocks:
                    keys = list(pkeys) + list(akeys)
                    if blk is not None:
                        keys.append(_port_key(fam, port_field, *blk))
                    if not keys:
                        keys = [U32Key(0, 0, 0)]
                    out.append(
                        TcFilter(
                            dev=dev,
                            parent=parent,
                            protocol="ip" if fam == 4 else "ipv6",
                            prio=prio,
                            keys=tuple(keys),
                            flowid=flowid,
                            rule=b.name,
                            note=note,
                        )
                    )
    return out


def compile_bandwidth(config: Config, hz: int) -> list[Device]:
    groups: dict[tuple[str, str], list[BandwidthRule]] = {}
    for b in config.bandwidth:
        groups.setdefault((b.interface, b.direction), []).append(b)
    devices: list[Device] = []
    root = tc_handle(TC_MAJOR)
    for (iface, direction), rules in groups.items():
        objs: list[TcObject] = []
        dev = iface if direction == "egress" else ifb_name(iface)
        if direction == "ingress":
            objs.append(TcLink(name=dev, kind="ifb", for_dev=iface))
        cap = next((b for b in rules if b.whole_interface), None)
        classes = [b for b in rules if not b.whole_interface]
        default_minor = TC_MINOR_TOP if cap is not None and not classes else TC_MINOR_DEFAULT
        objs.append(TcQdisc(dev=dev, kind="htb", handle=root, parent="root", default_minor=default_minor))
        if cap is not None:
            burst = cap.burst or kl.default_tc_burst(cap.rate, hz)
            top = tc_handle(TC_MAJOR, TC_MINOR_TOP)
            objs.append(
                TcClass(
                    dev=dev,
                    classid=top,
                    parent=root,
                    rate=cap.rate,
                    ceil=cap.rate,
                    burst=burst,
                    cburst=burst,
                    quantum=_quantum(cap.rate),
                    rule=cap.name,
                    note=_describe_bw(cap),
                )
            )
            parent, ceiling = top, cap.rate
        else:
            parent, ceiling = root, UNLIMITED_BITS
        if classes:
            used = sum(min(b.rate, ceiling) for b in classes)
            drate = max(ceiling - used, ceiling // 100, 8) if cap is not None else ceiling
            dburst = kl.default_tc_burst(ceiling, hz)
            objs.append(
                TcClass(
                    dev=dev,
                    classid=tc_handle(TC_MAJOR, TC_MINOR_DEFAULT),
                    parent=parent,
                    rate=drate,
                    ceil=ceiling,
                    burst=dburst,
                    cburst=dburst,
                    quantum=_quantum(drate),
                    note="default class: unclassified traffic"
                    + (" (shares the interface cap)" if cap is not None else " (not limited)"),
                )
            )
            for i, b in enumerate(classes):
                rate = min(b.rate, ceiling)
                burst = b.burst or kl.default_tc_burst(rate, hz)
                cid = tc_handle(TC_MAJOR, TC_MINOR_FIRST_RULE + i)
                objs.append(
                    TcClass(
                        dev=dev,
                        classid=cid,
                        parent=parent,
                        rate=rate,
                        ceil=rate,
                        burst=burst,
                        cburst=burst,
                        quantum=_quantum(rate),
                        rule=b.name,
                        note=_describe_bw(b),
                    )
                )
            for i, b in enumerate(classes):
                objs.extend(_filters_for(b, dev, root, tc_handle(TC_MAJOR, TC_MINOR_FIRST_RULE + i), i))
        if direction == "ingress":
            objs.append(TcQdisc(dev=iface, kind="ingress", handle=0xFFFF0000, parent="ingress"))
            objs.append(
                TcFilter(
                    dev=iface,
                    parent=0xFFFF0000,
                    protocol="all",
                    prio=TC_INGRESS_PRIO,
                    keys=(U32Key(0, 0, 0),),
                    redirect_to=dev,
                    note=f"redirect everything arriving on {iface} to {dev}",
                )
            )
        devices.append(Device(dev=dev, interface=iface, direction=direction, objects=tuple(objs)))
    return devices


# --- the whole file -------------------------------------------------------------


def compile_config(config: Config, hz: int | None = None, ingress_problem: str | None = nft_ingress.PROBE) -> Desired:
    """Compile a validated config into the objects netlimit installs. `ingress_problem`:
    why the host has no nftables ingress hook (None: it has one); by default the host is
    asked, only when the file has an `ingress:` section."""
    if hz is None:
        hz = kl.host_limits().hz
    if ingress_problem == nft_ingress.PROBE:
        ingress_problem = nft_ingress.hook_problem() if config.ingress is not None else None
    # `early: true` rules run in the XDP program instead of the packet filter (docs/xdp.md)
    filt = config
    if any(r.early for r in config.network):
        filt = config.model_copy(update={"network": [r for r in config.network if not r.early]})
    chains, rules = compile_network(filt)
    devices = compile_bandwidth(config, hz)
    names = tuple(r.name for r in config.network) + tuple(b.name for b in config.bandwidth)
    return Desired(
        chains=tuple(chains),
        rules=tuple(rules),
        devices=tuple(devices),
        rule_names=names,
        notes=(f"HZ={hz}",),
        nft=compile_nft(filt, ingress_problem),
        ipsets=tuple(compile_ipsets(filt)),
        xdp=compile_xdp(config),
        summary=summarize(config),
        config=config,
    )
