"""The compiler's output: a small set of frozen dataclasses.

Everything the kernel backends install and everything `netlimit plan` prints
is one of these objects, so plan and apply cannot disagree: render.py turns
them into iptables-save / tc text, the backends (nft/, xtables/, tc/) into
iptables-restore input, libiptc and pyroute2 calls.

Pure data, no kernel access, no heavy imports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# --- names and numbers netlimit owns --------------------------------------------

CHAIN_INPUT = "NETLIMIT"  # jumped to once from INPUT
CHAIN_FORWARD = "NETLIMIT-FWD"  # jumped to once from FORWARD
CHAIN_PREFIX = "NETLIMIT"  # every owned chain is NETLIMIT or NETLIMIT-*
LOG_CHAIN_PREFIX = "NETLIMIT-L-"  # per-rule chain of an `action: log` rule
COMMENT_PREFIX = "netlimit:"  # every owned rule carries "netlimit:<rule>"
COMMENT_SEP = " | "  # "netlimit:<rule> | <the rule's comment: text>" (+ " #<tag>" on nftables)
COMMENT_JUMP = "netlimit: jump"  # the jumps from built-in chains (a space: no rule name can collide)
COMMENT_EXEMPT = "netlimit: exempt"
COMMENT_BANS = "netlimit: bans"  # the rules that drop banned sources (README: Escalation and bans)
COMMENT_DENY = "netlimit: deny"  # the rules that drop the file's static `deny:` list
CHAIN_MAX = 28  # XT_EXTENSION_MAXNAMELEN - 1
LOG_PREFIX_MAX = 29

TC_MAJOR = 0x4E4C  # "NL": the root qdisc handle netlimit owns (4e4c:)
TC_INGRESS_PRIO = 0x4E4C  # pref of the ingress -> IFB redirect filter (20044)
TC_MINOR_TOP = 0x1  # the whole-interface cap class
TC_MINOR_DEFAULT = 0x2  # the default class (unclassified traffic)
TC_MINOR_FIRST_RULE = 0x10  # rule classes: 4e4c:10, 4e4c:11, ...
IFB_PREFIX = "nlifb-"
# "not limited": the rate of the default class when no whole-interface cap exists
UNLIMITED_BITS = 100 * 10**9


def owned_comment(comment: str | None) -> bool:
    return comment is not None and comment.startswith(COMMENT_PREFIX)


def owned_chain(name: str) -> bool:
    return name == CHAIN_PREFIX or name.startswith(CHAIN_PREFIX + "-")


def rule_of_comment(comment: str) -> str:
    """'netlimit:ssh-guard' -> 'ssh-guard'; 'netlimit: exempt' -> '(exempt)'; an nftables
    fingerprint (' #0123456789ab') is not part of the name."""
    rest = comment[len(COMMENT_PREFIX) :]
    tag = rest.rfind(" #")
    if tag >= 0 and len(rest) - tag - 2 == NFT_TAG_LEN:
        rest = rest[:tag]
    rest = rest.split(COMMENT_SEP, 1)[0]  # the rule's own `comment:` text follows the name
    return f"({rest.strip()})" if rest.startswith(" ") else rest


# --- iptables -------------------------------------------------------------------


@dataclass(frozen=True)
class Match:
    """One `-m module --option value ...` block, options in iptables-save order.

    A value of None is a flag (`--set`, `--rsource`).
    """

    module: str
    options: tuple[tuple[str, str | None], ...] = ()


@dataclass(frozen=True)
class IptChain:
    family: int  # 4 | 6
    table: str  # "filter"
    name: str
    rule: str  # the rule a per-rule chain belongs to; "" for shared chains


@dataclass(frozen=True)
class IptRule:
    """One iptables/ip6tables rule.

    `position` 0 means "insert at the top" (only the jumps from built-in
    chains); None means append in order within the chain.
    """

    family: int
    table: str
    chain: str
    rule: str  # rule name for grouping ("" = netlimit infrastructure)
    comment: str
    src: str | None = None
    dst: str | None = None
    in_iface: str | None = None
    protocol: str | None = None
    matches: tuple[Match, ...] = ()
    target: str | None = None  # None: no -j (a counting / --set rule)
    target_options: tuple[tuple[str, str | None], ...] = ()
    position: int | None = None
    note: str = ""  # human explanation for plan output

    @property
    def all_matches(self) -> tuple[Match, ...]:
        """The comment match first, then the rule's own matches."""
        return (Match("comment", (("comment", self.comment),)),) + self.matches


# --- ipsets (the legacy backends' ban sets) ---------------------------------------------

IPSET_PREFIX = "netlimit-"  # netlimit owns every ipset named netlimit-*
IPSET_BAN_SETS = {4: "netlimit-bans4", 6: "netlimit-bans6"}  # the ban list (the daemon writes them)
IPSET_KERNEL_BAN_PREFIX = "netlimit-k"  # netlimit-k4-<rule>: sources a network rule's escalation banned
IPSET_NAME_MAX = 31


@dataclass(frozen=True)
class IpSet:
    """An ipset netlimit owns: created before the rules that match it, destroyed after."""

    name: str
    type: str  # "hash:net" | "hash:ip"
    family: int  # 4 | 6
    maxelem: int
    timeout: int  # the default timeout of an element (0: each element carries its own)
    netmask: int | None = None  # hash:ip: the prefix an added address is stored as
    rule: str = ""  # the netlimit rule ("" = the ban list)

    @property
    def header(self) -> str:
        """The create options, in the order `ipset list` prints them."""
        fam = "inet" if self.family == 4 else "inet6"
        mask = f" netmask {self.netmask}" if self.netmask is not None else ""
        return f"family {fam} hashsize 1024 maxelem {self.maxelem}{mask} timeout {self.timeout}"

    def header_fields(self) -> dict[str, str]:
        toks = self.header.split()
        fields = {toks[i]: toks[i + 1] for i in range(0, len(toks) - 1, 2)}
        fields.pop("hashsize")  # ipset grows it as the set fills
        return fields


# --- nftables -------------------------------------------------------------------
# One table `inet netlimit` (IPv4 and IPv6) that netlimit owns whole: base chains
# `input` and `forward` at NFT_PRIORITY, after conntrack (-200) and before the
# filter chains of iptables-nft, firewalld and docker (0 and above), so a limit
# drops before any accept elsewhere; netlimit's chains never accept for others
# (exempt is a `return`). A base chain holds the exempt rules, then one jump per
# network rule, in file order, to the rule's own chain `rule-<name>`: a changed
# rule is rewritten inside its chain (appended, nothing else moves).

NFT_FAMILY = "inet"
NFT_TABLE = "netlimit"
NFT_PRIORITY = -10  # nft spells it "filter - 10"
NFT_CHAINS = {"input": "input", "forward": "forward"}  # base chain -> hook
# The `ingress:` stage (docs/xdp.md, "Stages"): one base chain `ingress` on the inet
# family's ingress hook (kernel >= 5.10, nft >= 1.0.1) for the listed devices, holding
# exempt, deny and the bans before the IP stack (no conntrack, no routing yet). Its
# priority runs it before any other ingress chain of the namespace at the default 0.
NFT_INGRESS_CHAIN = "ingress"
NFT_INGRESS_PRIORITY = -500
NFT_RULE_CHAIN_PREFIX = "rule-"  # each network rule's own chain: rule-<name>, jumped to in file order
NFT_TAG_LEN = 12  # hex digits of the fingerprint in every comment
# The ban list every netlimitd follows (netlimit.bans): per family, a hash set of single
# addresses (/32, /128: most bans) and an interval set of wider prefixes, whose elements
# (key + timeout) the daemon writes; a rule's own bans (escalate on a network rule) go to
# a dynamic set per rule and family that the packet path fills itself.
NFT_BAN_SETS = {4: "bans4", 6: "bans6"}
NFT_BAN_HOST_SETS = {4: "banhosts4", 6: "banhosts6"}
NFT_DENY_SETS = {4: "deny4", 6: "deny6"}  # the file's `deny:` list (interval sets, no timeout)
NFT_KERNEL_BAN_PREFIX = "kban"  # kban4-<rule>: sources a network rule's escalation banned
NFT_ESCALATE_PREFIX = "esc"  # esc4-<rule>: over-limit packets per source, counted for escalation
NFT_OVER_CHAIN_PREFIX = "over-"  # over-<rule>: what an escalating rule does with a packet over its limit


@dataclass(frozen=True)
class NftChain:
    """A base chain ("input", "forward", "ingress": hook set) or a rule's own chain (hook
    None); an ingress chain names its devices."""

    name: str
    hook: str | None = None
    priority: int = NFT_PRIORITY
    policy: str = "accept"
    devices: tuple[str, ...] = ()

    @property
    def spec(self) -> str:
        if self.hook is None:
            return ""
        devs = ""
        if self.devices:
            devs = " devices = { " + ", ".join(f'"{d}"' for d in self.devices) + " }"
        return f"type filter hook {self.hook}{devs} priority {self.priority}; policy {self.policy};"


@dataclass(frozen=True)
class NftSet:
    """A named set: the exempt prefixes, or a rule's per-key state (dynamic, with
    timeout). `comment` carries the fingerprint of everything that decides what the
    elements mean (the declaration, the elements, the expression each element
    holds): a set is replaced exactly when that changes, and kept (with its state)
    otherwise."""

    name: str
    spec: str  # "type ipv4_addr; flags dynamic,timeout; timeout 10000ms; size 65536;"
    rule: str  # the netlimit rule ("" = exempt)
    comment: str  # "netlimit:<rule> #<fingerprint>"
    elements: tuple[str, ...] = ()


@dataclass(frozen=True)
class NftRule:
    """One rule of a base chain: `body` is the nft statement text without its comment;
    `comment` "netlimit:<rule> #<fingerprint>" identifies it (the fingerprint covers
    the body and the sets it uses)."""

    chain: str
    body: str
    rule: str  # the netlimit rule ("" = exempt)
    comment: str
    family: int
    sets: tuple[str, ...] = ()  # the named sets it references
    note: str = ""

    @property
    def text(self) -> str:
        return f'{self.body} comment "{self.comment}"'


@dataclass(frozen=True)
class NftTable:
    chains: tuple[NftChain, ...] = ()
    sets: tuple[NftSet, ...] = ()
    rules: tuple[NftRule, ...] = ()
    #: where deny and the bans are matched, for `plan` (not part of the kernel state)
    stage: str = field(default="", compare=False, hash=False)

    @property
    def empty(self) -> bool:
        return not self.chains


# --- tc -------------------------------------------------------------------------


@dataclass(frozen=True)
class TcLink:
    """An IFB device netlimit creates for ingress shaping of `for_dev`."""

    name: str
    kind: str  # "ifb"
    for_dev: str
    rule: str = ""

    @property
    def dev(self) -> str:
        return self.name


@dataclass(frozen=True)
class TcQdisc:
    dev: str
    kind: str  # "htb" | "ingress"
    handle: int  # 0x4e4c0000 | 0xffff0000
    parent: str  # "root" | "ingress"
    default_minor: int = 0  # htb only
    rule: str = ""


@dataclass(frozen=True)
class TcClass:
    dev: str
    classid: int
    parent: int  # qdisc handle or parent class id
    rate: int  # bits/s
    ceil: int  # bits/s
    burst: int  # bytes
    cburst: int  # bytes
    quantum: int  # bytes
    rule: str = ""
    note: str = ""


@dataclass(frozen=True)
class U32Key:
    value: int
    mask: int
    offset: int  # from the network header, 4-byte aligned

    def pyroute2(self) -> str:
        if self.mask == 0:
            return f"0x0/0x0+{self.offset}"  # pyroute2 strips '00' pairs from a mask: keep one digit
        return f"0x{self.value:08x}/0x{self.mask:08x}+{self.offset}"


@dataclass(frozen=True)
class TcFilter:
    dev: str
    parent: int  # 0x4e4c0000 or the ingress 0xffff0000
    protocol: str  # "ip" | "ipv6" | "all"
    prio: int
    keys: tuple[U32Key, ...]
    flowid: int | None = None  # classify into this class
    redirect_to: str | None = None  # or: mirred egress redirect to this device
    rule: str = ""
    note: str = ""


TcObject = TcLink | TcQdisc | TcClass | TcFilter


@dataclass(frozen=True)
class Device:
    """Everything netlimit puts on one device (an interface, or its IFB)."""

    dev: str  # where the HTB tree lives
    interface: str  # the interface named in the rules
    direction: str  # egress | ingress
    objects: tuple[TcObject, ...]  # in install order


@dataclass(frozen=True)
class Desired:
    """The whole compiled state of a file."""

    chains: tuple[IptChain, ...] = ()
    rules: tuple[IptRule, ...] = ()
    devices: tuple[Device, ...] = ()
    nft: NftTable = field(default_factory=NftTable)  # the same network rules for the nftables backend
    ipsets: tuple[IpSet, ...] = ()  # the legacy backends' ban sets (made before the rules that match them)
    rule_names: tuple[str, ...] = ()  # network + bandwidth rule names, file order
    notes: tuple[str, ...] = field(default=())
    #: each rule as `netlimit list` describes it (listing.summarize); not part of the kernel state
    summary: tuple[dict[str, Any], ...] = field(default=(), compare=False, hash=False)
    #: the config compiled (None for "nothing": flush): a backend family that compiles its own
    #: objects reads it in its plan() (docs/architecture.md, How to add a kernel backend)
    config: Any = field(default=None, compare=False, hash=False, repr=False)
    #: the `xdp:` stage (kernel/xdp/stage.py XdpDesired), None without an `xdp:` section
    xdp: Any = None

    def family_rules(self, family: int) -> tuple[IptRule, ...]:
        return tuple(r for r in self.rules if r.family == family)

    def family_chains(self, family: int) -> tuple[IptChain, ...]:
        return tuple(c for c in self.chains if c.family == family)

    @property
    def tc_objects(self) -> tuple[TcObject, ...]:
        return tuple(o for d in self.devices for o in d.objects)


def tc_handle(major: int, minor: int = 0) -> int:
    return (major << 16) | minor


def fmt_handle(h: int) -> str:
    """0x4e4c0010 -> '4e4c:10' (tc's spelling); 0x4e4c0000 -> '4e4c:'."""
    major, minor = h >> 16, h & 0xFFFF
    return f"{major:x}:" if minor == 0 else f"{major:x}:{minor:x}"
