"""Network rules -> the nftables table netlimit owns. Pure: no kernel access, no root.

The same rules compile.py turns into iptables rules, as native nft constructs in
one table `inet netlimit` (no `xt` compat matches). Layout: the base chains
`input` and `forward` hold the exempt rules, then one `jump rule-<name>` per
network rule in file order; `rule-<name>` holds the rule's IPv4, then IPv6 rules.

* exempt: a named interval set per family (`exempt4`, `exempt6`), matched first
  (`return`);
* hashlimit (the default `method`): a dynamic set with timeout per rule and family
  whose elements each hold their own token bucket,
  `update @limit4-<rule> { <key> limit rate over N/unit burst B packets }`; the key
  follows `per` (`ip saddr`, `ip daddr`, `ip saddr . th dport`; `per: all` is a
  plain `limit` statement) with `source_prefix` / `source_prefix6` as a mask on the
  address; `htable_max` is the set's size and `htable_expire` its timeout;
* connlimit (`max_connections`): `add @conns4-<rule> { <key> ct count over N }`;
* `method: recent`: nft keeps no hit log per address, so the closest native
  construct is a token bucket of N per period (burst N) per address, plus a ban set
  (timeout: the period) that an address over the bucket enters and that every
  further attempt while banned refreshes: like `recent --update`, a client that
  keeps knocking stays blocked until it has been quiet for a whole period. The
  difference: recent counts every hit of the last period, dropped ones too, and
  blocks at hit N+1; the bucket refills continuously, so a client coming a little
  faster than N per period passes until the bucket runs dry (3/minute, one
  attempt every 15 s: 8 of 9 pass in 2 minutes, against 3 under recent; README,
  "recent under nftables", has every scenario measured: scripts/recent_vs_nft.py);
* actions: drop, reject (TCP reset for tcp rules, else ICMP port unreachable), log
  (a rate-limited `log prefix "netlimit:<rule> "`, no verdict); a counter on every rule.

Every rule and set carries the comment `netlimit:<rule> #<fingerprint>` (12 hex
digits of a SHA-1 over what it does): the nftables backend compares fingerprints,
so it never has to predict how nft prints a rule back, and replaces a rule or set
exactly when its meaning changes (a set with a new rate starts empty, as the
kernel's hashlimit table would).
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterable

from ...config.model import Config, NetworkRule
from ...config.units import PortRange, Rate
from ..network_common import (
    HASHLIMIT_DEFAULT_MAX,
    LOG_LIMIT_BURST,
    burst_of,
    comment_for,
    describe_network,
    expire_ms,
    log_prefix,
)
from ..objects import (
    COMMENT_BANS,
    COMMENT_DENY,
    COMMENT_EXEMPT,
    NFT_BAN_HOST_SETS,
    NFT_BAN_SETS,
    NFT_CHAINS,
    NFT_DENY_SETS,
    NFT_ESCALATE_PREFIX,
    NFT_INGRESS_CHAIN,
    NFT_INGRESS_PRIORITY,
    NFT_KERNEL_BAN_PREFIX,
    NFT_OVER_CHAIN_PREFIX,
    NFT_RULE_CHAIN_PREFIX,
    NFT_TAG_LEN,
    NftChain,
    NftRule,
    NftSet,
    NftTable,
)

NFPROTO = {4: "ipv4", 6: "ipv6"}
ADDR = {4: "ip", 6: "ip6"}
ADDR_TYPE = {4: "ipv4_addr", 6: "ipv6_addr"}
ICMP = {4: "icmp", 6: "ipv6-icmp"}
PORT_PROTOS = "{ tcp, udp, udplite, sctp, dccp }"  # the protocols hashlimit reads a port of
SET_DEFAULT_SIZE = HASHLIMIT_DEFAULT_MAX
LOG_RATE = "10/minute"  # compile.LOG_LIMIT in nft's words


def _tag(*parts: str) -> str:
    return hashlib.sha1("\x00".join(parts).encode()).hexdigest()[:NFT_TAG_LEN]


def nft_rate(rate: Rate) -> str:
    """'100/second'; a rate no whole N per second|minute|hour|day expresses (recent
    allows 7/13s) is rounded down per day (at most 1/86400 off)."""
    exact = rate.exact()
    if exact is not None:
        return f"{exact[0]}/{exact[1]}"  # nft's units are the file's: second, minute, hour, day
    return f"{max(1, rate.count * 86400 // rate.period)}/day"


def _values(items: list[str]) -> str:
    return items[0] if len(items) == 1 else "{ " + ", ".join(items) + " }"


def _ports(ports: Iterable[PortRange]) -> str:
    return _values([str(p.first) if p.first == p.last else f"{p.first}-{p.last}" for p in sorted(set(ports))])


def _nets(nets: Iterable, family: int) -> list[str] | None:
    """A rule's CIDRs of one family as nft spells them; [] when it names none of this
    family, None when one of them is /0 (any address: no match needed)."""
    out: list[str] = []
    for n in nets:
        if n.version != family:
            continue
        if n.prefixlen == 0:
            return None
        out.append(str(n.network_address) if n.prefixlen == n.max_prefixlen else str(n))
    return out


def _masked(family: int, field: str, prefix: int | None) -> str:
    """`ip saddr` or, grouped by a prefix, `ip saddr & 255.255.255.0`."""
    expr = f"{ADDR[family]} {field}"
    bits = 32 if family == 4 else 128
    if prefix is None or prefix == bits:
        return expr
    mask = ipaddress.ip_network(f"{'0.0.0.0' if family == 4 else '::'}/{prefix}").netmask
    return f"{expr} & {mask}"


def over_chain(rule_name: str) -> str:
    return f"{NFT_OVER_CHAIN_PREFIX}{rule_name}"


def _verdict(rule: NetworkRule, escalating: bool = True) -> str:
    if escalating and rule.escalate is not None:
        return f"goto {over_chain(rule.name)}"  # counts the packet for escalation, then the action
    if rule.action == "drop":
        return "counter drop"
    if rule.action == "reject":
        return "counter reject with " + ("tcp reset" if rule.protocol == "tcp" else "icmpx port-unreachable")
    return (
        f"counter limit rate {LOG_RATE} burst {LOG_LIMIT_BURST} packets "
        f'log prefix "{log_prefix(rule.name)}"'  # shadow: count and log, no verdict
    )


def _dynamic_spec(key_type: str, timeout_ms: int | None, size: int) -> str:
    flags = "dynamic,timeout" if timeout_ms is not None else "dynamic"
    timeout = f" timeout {timeout_ms}ms;" if timeout_ms is not None else ""
    return f"type {key_type}; flags {flags};{timeout} size {size};"


class _Rules:
    """Sets and rules as they are made, in order."""

    def __init__(self, texts: dict[str, str] | None = None) -> None:
        self.sets: list[NftSet] = []
        self.rules: list[NftRule] = []
        self.texts = texts or {}  # rule name -> its `comment:` (into the rules' comments)

    def set(
        self, name: str, spec: str, rule: str, holds: str, elements: tuple[str, ...] = (), owner: str = COMMENT_EXEMPT
    ) -> NftSet:
        tag = _tag(name, spec, holds, *elements)
        s = NftSet(name, spec, rule, f"{comment_for(rule) if rule else owner} #{tag}", elements)
        self.sets.append(s)
        return s

    def rule(
        self, chain: str, family: int, name: str, body: str, sets: list[NftSet], note: str, owner: str = COMMENT_EXEMPT
    ) -> None:
        tag = _tag(body, *(s.comment for s in sets))
        comment = f"{comment_for(name, self.texts.get(name)) if name else owner} #{tag}"
        self.rules.append(NftRule(chain, body, name, comment, family, tuple(s.name for s in sets), note))


def _match(rule: NetworkRule, family: int) -> str | None:
    """The part of a rule that says which packets it looks at (None: none of this family)."""
    parts = [f"meta nfproto {NFPROTO[family]}"]
    if rule.interface:
        parts.append(f'iifname "{rule.interface}"')
    for field, nets in (("saddr", rule.sources), ("daddr", rule.destinations)):
        if not nets:
            continue
        vals = _nets(nets, family)
        if vals is not None and not vals:
            return None
        if vals:
            parts.append(f"{ADDR[family]} {field} {_values(vals)}")
    if rule.protocol in ("tcp", "udp"):
        parts.append(f"{rule.protocol} dport {_ports(rule.ports)}" if rule.ports else f"meta l4proto {rule.protocol}")
    elif rule.protocol == "icmp":
        parts.append(f"meta l4proto {ICMP[family]}")
    if rule.new_connections or rule.max_connections is not None:
        parts.append("ct state new")
    return " ".join(parts)


def _network(out: _Rules, rule: NetworkRule, family: int, chain: str) -> None:
    match = _match(rule, family)
    if match is None:
        return
    name, v = rule.name, str(family)
    note = describe_network(rule)
    verdict = _verdict(rule)
    prefix = rule.source_prefix if family == 4 else rule.source_prefix6
    field = "daddr" if rule.per == "destination" else "saddr"

    if rule.max_connections is not None:
        n = rule.max_connections
        if rule.per == "all":
            out.rule(chain, family, name, f"{match} ct count over {n} {verdict}", [], note)
            return
        key = _masked(family, field, prefix if field == "saddr" else None)
        holds = f"{key} ct count over {n}"
        s = out.set(f"conns{v}-{name}", _dynamic_spec(ADDR_TYPE[family], None, SET_DEFAULT_SIZE), name, holds)
        out.rule(chain, family, name, f"{match} add @{s.name} {{ {holds} }} {verdict}", [s], note)
        return

    assert rule.limit is not None
    rate = nft_rate(rule.limit)
    if rule.method == "recent":
        period_ms = rule.limit.period * 1000
        key = f"{ADDR[family]} {field}"
        spec = _dynamic_spec(ADDR_TYPE[family], period_ms, SET_DEFAULT_SIZE)
        bucket = f"{key} limit rate over {rate} burst {rule.limit.count} packets"
        tokens = out.set(f"recent{v}-{name}", spec, name, bucket)
        ban = out.set(f"ban{v}-{name}", spec, name, key)
        note += f"; in nftables: a bucket of {rule.limit.count} per period, then a ban each attempt renews"
        # banned: dropped, and every attempt keeps the ban for another period
        out.rule(
            chain, family, name, f"{match} {key} @{ban.name} update @{ban.name} {{ {key} }} {verdict}", [ban], note
        )
        # over the bucket: banned
        body = f"{match} update @{tokens.name} {{ {bucket} }} add @{ban.name} {{ {key} }} {verdict}"
        out.rule(chain, family, name, body, [tokens, ban], note)
        return

    limit = f"limit rate over {rate} burst {burst_of(rule)} packets"
    if rule.per == "all":
        out.rule(chain, family, name, f"{match} {limit} {verdict}", [], note)
        return
    # hashlimit's htable_max is the set's size (htable_size, its hash buckets, has no nft twin)
    size = rule.htable_max if rule.htable_max is not None else max(SET_DEFAULT_SIZE, rule.htable_size or 0)
    expire = expire_ms(rule)
    key = _masked(family, field, prefix if field == "saddr" else None)
    keyed: list[tuple[str, str, str, str]] = []  # (set name, key, key type, extra match)
    if rule.per == "source+port" and rule.protocol in ("tcp", "udp"):
        keyed.append((f"limit{v}-{name}", f"{key} . th dport", f"{ADDR_TYPE[family]} . inet_service", ""))
    elif rule.per == "source+port" and rule.protocol == "all":
        # as hashlimit: the destination port where the protocol has one, else port 0 (one bucket per address)
        keyed.append(
            (
                f"limit{v}-{name}",
                f"{key} . th dport",
                f"{ADDR_TYPE[family]} . inet_service",
                f"meta l4proto {PORT_PROTOS} ",
            )
        )
        keyed.append((f"limit{v}p-{name}", key, ADDR_TYPE[family], f"meta l4proto != {PORT_PROTOS} "))
    else:
        keyed.append((f"limit{v}-{name}", key, ADDR_TYPE[family], ""))
    for set_name, k, key_type, extra in keyed:
        holds = f"{k} {limit}"
        s = out.set(set_name, _dynamic_spec(key_type, expire, size), name, holds)
        out.rule(chain, family, name, f"{match} {extra}update @{s.name} {{ {holds} }} {verdict}", [s], note)


def _escalation(out: _Rules, rule: NetworkRule, family: int, max_bans: int) -> NftSet:
    """An escalating rule's over chain, one family: count the source's over-limit packets
    (a token bucket of `after` per `within`, per source prefix) and, over it, add the
    prefix to the rule's kernel ban set (`ban` long); then the rule's own action. Returns
    the ban set (the base chains drop its sources)."""
    esc = rule.escalate
    assert esc is not None
    name, v = rule.name, str(family)
    key = _masked(family, "saddr", esc.prefix(family))
    bans = out.set(
        f"{NFT_KERNEL_BAN_PREFIX}{v}-{name}",
        _dynamic_spec(ADDR_TYPE[family], esc.ban * 1000, max_bans),
        name,
        key,
    )
    exact = Rate(esc.after, "second", esc.within).exact()
    assert exact is not None, "validate refuses a `within` no whole rate expresses"
    count = f"{key} limit rate over {exact[0]}/{exact[1]} burst {esc.after} packets"
    counter = out.set(
        f"{NFT_ESCALATE_PREFIX}{v}-{name}",
        _dynamic_spec(ADDR_TYPE[family], esc.within * 1000, SET_DEFAULT_SIZE),
        name,
        count,
    )
    note = f"escalate: {esc.after} over-limit packets within {esc.within} s -> ban the source's /{esc.prefix(family)}"
    body = f"meta nfproto {NFPROTO[family]} update @{counter.name} {{ {count} }} add @{bans.name} {{ {key} }}"
    out.rule(over_chain(name), family, name, body, [counter, bans], note)
    return bans


def deny_nets(config: Config, family: int) -> list:
    """The `deny:` entries of one family, overlaps merged (an interval set refuses them)."""
    nets: list = [n for n in config.deny if n.version == family]
    return list(ipaddress.collapse_addresses(nets))


def _ingress(config: Config, problem: str | None) -> tuple[list[NftChain], str]:
    """The `ingress:` stage's chain (none when the file has no such section, nothing to
    match there, or the host lacks the hook: `problem`) and where deny and the bans are
    matched, in words, for `plan`."""
    if config.ingress is None or not (config.deny or config.bans_on):
        return [], ""  # the input chain, as ever (plan shows nothing new)
    devs = ", ".join(config.ingress.interfaces)
    if problem is not None:
        return [], f"deny and bans: input chain (the ingress hook is unavailable: {problem})"
    chain = NftChain(NFT_INGRESS_CHAIN, "ingress", NFT_INGRESS_PRIORITY, devices=tuple(config.ingress.interfaces))
    return [chain], (
        f"deny and bans: ingress hook on {devs} (priority {NFT_INGRESS_PRIORITY}, before conntrack), "
        "then the input chain for packets of other interfaces"
    )


def compile_nft(config: Config, ingress_problem: str | None = None) -> NftTable:
    """The table for `config`'s exempt list and network rules (empty: no chains).

    Order: the base chains (the `ingress:` stage's chain first when there is one: exempt,
    deny and bans only; then input and forward: exempt, deny, bans, then one jump per
    network rule in file order), then each rule's chain (IPv4 before IPv6, as the
    iptables chains read); sets in the same order. `ingress_problem`: why the host
    cannot run the ingress hook (deny and bans then stay in the input chain alone)."""
    texts = {r.name: r.comment for r in config.network if r.comment}
    out = _Rules(texts)
    jumps: dict[str, list[str]] = {"input": [], "forward": []}  # base chain -> rule chains, in file order
    rule_chains: list[NftChain] = []
    kernel_bans: list[tuple[int, str, NftSet]] = []  # (family, the source's key, the rule's ban set)
    for r in config.network:
        chain = f"{NFT_RULE_CHAIN_PREFIX}{r.name}"
        before = len(out.rules)
        for family in r.families:
            _network(out, r, family, chain)
        if len(out.rules) > before:
            rule_chains.append(NftChain(chain))
            jumps["input" if r.chain == "input" else "forward"].append(r.name)
            if r.escalate is not None:
                rule_chains.append(NftChain(over_chain(r.name)))
                for family in r.families:
                    if any(x.chain == chain and x.family == family for x in out.rules[before:]):
                        bans = _escalation(out, r, family, config.max_bans)
                        kernel_bans.append((family, _masked(family, "saddr", r.escalate.prefix(family)), bans))
                out.rule(over_chain(r.name), 0, r.name, _verdict(r, escalating=False), [], describe_network(r))
    if (config.bans_on or config.deny) and not jumps["input"] and not jumps["forward"]:
        bases = [NftChain("input", NFT_CHAINS["input"])]  # bans or deny alone: dropped on input
    else:
        bases = [NftChain(c, NFT_CHAINS[c]) for c in ("input", "forward") if jumps[c]]
    if not bases:
        return NftTable()
    ingress, stage = _ingress(config, ingress_problem)
    bases = ingress + bases  # the ingress chain holds no jumps (no conntrack there: no limits)
    head = _Rules(texts)
    for family in (4, 6):
        nets = tuple(str(n) for n in config.exempt if n.version == family)
        if nets:
            s = head.set(f"exempt{family}", f"type {ADDR_TYPE[family]}; flags interval;", "", "", nets)
            for c in bases:
                body = f"meta nfproto {NFPROTO[family]} {ADDR[family]} saddr @{s.name} counter return"
                head.rule(c.name, family, "", body, [s], "exempt: never limited")
    for family in (4, 6):  # the static deny list: after exempt (validate refuses overlaps), before bans
        nets = tuple(str(n) for n in deny_nets(config, family))
        if nets:
            s = head.set(
                NFT_DENY_SETS[family], f"type {ADDR_TYPE[family]}; flags interval;", "", "", nets, COMMENT_DENY
            )
            for c in bases:
                body = f"meta nfproto {NFPROTO[family]} {ADDR[family]} saddr @{s.name} counter drop"
                head.rule(c.name, family, "", body, [s], "deny: always dropped", owner=COMMENT_DENY)
    if config.bans_on:  # after exempt (never banned), before every limit
        for family in (4, 6):
            # single addresses in a hash set (one element each, O(1) per packet), wider
            # prefixes in an interval set (two elements each): a start writes 100,000
            # bans into both (issue 35), the kernel's time goes with the elements
            hosts = head.set(
                NFT_BAN_HOST_SETS[family], f"type {ADDR_TYPE[family]}; flags timeout;", "", "", owner=COMMENT_BANS
            )
            s = head.set(
                NFT_BAN_SETS[family], f"type {ADDR_TYPE[family]}; flags interval,timeout;", "", "", owner=COMMENT_BANS
            )
            for c in bases:
                for banned, what in ((hosts, "address"), (s, "prefix")):
                    body = f"meta nfproto {NFPROTO[family]} {ADDR[family]} saddr @{banned.name} counter drop"
                    note = f"banned {what} (netlimit ban list)"
                    head.rule(c.name, family, "", body, [banned], note, owner=COMMENT_BANS)
        for family, key, bans in kernel_bans:
            for c in bases:
                body = f"meta nfproto {NFPROTO[family]} {key} @{bans.name} counter drop"
                head.rule(c.name, family, "", body, [bans], f"banned by rule {bans.rule}", owner=COMMENT_BANS)
    notes = {r.name: describe_network(r) for r in config.network}
    for c in bases:
        for name in jumps.get(c.name, ()):
            head.rule(c.name, 0, name, f"jump {NFT_RULE_CHAIN_PREFIX}{name}", [], notes[name])
    return NftTable(
        chains=tuple(bases + rule_chains),
        sets=tuple(head.sets + out.sets),
        rules=tuple(head.rules + out.rules),
        stage=stage,
    )
