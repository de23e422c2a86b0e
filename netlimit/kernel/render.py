"""Desired objects -> text: iptables-save lines, the nft script, tc commands, the plan, JSON.

Pure. The iptables lines are what `iptables-legacy-save` prints for the same
rules (option order included), so plan output can be compared with the kernel
by eye and pasted into `iptables-legacy-restore --noflush`; the nft script is
what the nftables backend writes (the table in one block, for `nft -f -`).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from ..config.units import format_bandwidth
from .objects import (
    NFT_FAMILY,
    NFT_TABLE,
    Desired,
    IptChain,
    IptRule,
    Match,
    NftRule,
    NftSet,
    TcClass,
    TcFilter,
    TcLink,
    TcObject,
    TcQdisc,
    fmt_handle,
)
from .registry import backend as backend_of

FAMILY_TOOL = {4: "iptables", 6: "ip6tables"}


_PLAIN = re.compile(r"[\w\-./:,+=@%~]+")  # \w: str.isalnum() characters and "_"


def _q(value: str) -> str:
    """Quote like iptables-save does: only when needed, with double quotes."""
    if value and _PLAIN.fullmatch(value):
        return value
    return _dq(value)


# options iptables-save always prints in double quotes
_ALWAYS_QUOTED = {"comment", "log-prefix"}
# options whose value is several words ("netlimit-bans4 src"), written as they are
_WORDS = {"match-set", "add-set", "del-set"}


def _opts(options) -> list[str]:
    out: list[str] = []
    for k, v in options:
        out.append(f"--{k}")
        if v is not None:
            out.append(_dq(v) if k in _ALWAYS_QUOTED else v if k in _WORDS else _q(v))
    return out


def _dq(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@lru_cache(maxsize=1 << 14)
def _match_text(m: Match) -> str:
    return " ".join(["-m", m.module] + _opts(m.options))


def rule_spec(r: IptRule) -> str:
    """The rule without '-A CHAIN': '-s 10.0.0.0/8 -p tcp -m comment ... -j DROP'."""
    parts: list[str] = []
    if r.src:
        parts += ["-s", r.src]
    if r.dst:
        parts += ["-d", r.dst]
    if r.in_iface:
        parts += ["-i", r.in_iface]
    if r.protocol:
        parts += ["-p", r.protocol]
    parts.append("-m comment --comment " + _dq(r.comment))  # all_matches[0], spelt directly
    parts.extend(_match_text(m) for m in r.matches)
    if r.target:
        parts += ["-j", r.target] + _opts(r.target_options)
    return " ".join(parts)


def rule_line(r: IptRule) -> str:
    if r.position == 0:
        return f"-I {r.chain} 1 {rule_spec(r)}"
    return f"-A {r.chain} {rule_spec(r)}"


def iptables_save_text(desired: Desired, family: int, *, headers: bool = True) -> str:
    """One family's rules as an iptables-restore --noflush input, grouped by rule."""
    chains = desired.family_chains(family)
    rules = desired.family_rules(family)
    if not rules:
        return ""
    lines = ["*filter"]
    for c in chains:
        lines.append(f":{c.name} - [0:0]")
    last: tuple[str, str] | None = None
    for r in rules:
        group = (r.chain, r.rule or r.comment)
        if headers and group != last:
            lines.append(f"# {_group_title(r)}")
            last = group
        lines.append(rule_line(r))
    lines.append("COMMIT")
    return "\n".join(lines) + "\n"


def _group_title(r: IptRule) -> str:
    if r.rule:
        return (
            f"rule {r.rule}: {r.note}" if r.note and not r.note.startswith(("remember", "shadow")) else f"rule {r.rule}"
        )
    return r.note or r.comment


# --- nftables -------------------------------------------------------------------


def nft_set_body(s: NftSet) -> str:
    """'{ type ipv4_addr; ...; comment "..."; }' as `add set` and a table block take it."""
    elements = f" elements = {{ {', '.join(s.elements)} }};" if s.elements else ""
    return f'{{ {s.spec}{elements} comment "{s.comment}"; }}'


def nft_set_text(s: NftSet) -> str:
    return f"set {s.name} {nft_set_body(s)}"


def _nft_title(r: NftRule) -> str:
    return f"rule {r.rule}: {r.note}" if r.rule else r.note


def nft_text(desired: Desired, *, headers: bool = True) -> str:
    """The table as one `nft -f` block: sets, then each chain with its rules, grouped by rule."""
    t = desired.nft
    if t.empty:
        return ""
    lines = [f"table {NFT_FAMILY} {NFT_TABLE} {{"]
    lines.extend(f"\t{nft_set_text(s)}" for s in t.sets)
    for c in t.chains:
        lines.append(f"\tchain {c.name} {{")
        if c.spec:
            lines.append(f"\t\t{c.spec}")
        last = None
        for r in t.rules:
            if r.chain != c.name:
                continue
            if headers and (r.rule, r.note) != last and (c.hook is None or not r.rule):
                lines.append(f"\t\t# {_nft_title(r)}")
                last = (r.rule, r.note)
            lines.append(f"\t\t{r.text}")
        lines.append("\t}")
    lines.append("}")
    return "\n".join(lines) + "\n"


# --- tc -------------------------------------------------------------------------


def _bits(v: int) -> str:
    return format_bandwidth(v)


def tc_command(o: TcObject) -> str:
    if isinstance(o, TcLink):
        return f"ip link add {o.name} type {o.kind} && ip link set {o.name} up"
    if isinstance(o, TcQdisc):
        if o.kind == "ingress":
            return f"tc qdisc add dev {o.dev} handle ffff: ingress"
        return f"tc qdisc add dev {o.dev} root handle {fmt_handle(o.handle)} htb default {o.default_minor:x}"
    if isinstance(o, TcClass):
        return (
            f"tc class add dev {o.dev} parent {fmt_handle(o.parent)} classid {fmt_handle(o.classid)} htb "
            f"rate {_bits(o.rate)} ceil {_bits(o.ceil)} burst {o.burst}b cburst {o.cburst}b "
            f"quantum {o.quantum}"
        )
    if isinstance(o, TcFilter):
        keys = " ".join(f"match u32 0x{k.value:08x} 0x{k.mask:08x} at {k.offset}" for k in o.keys)
        head = f"tc filter add dev {o.dev} parent {fmt_handle(o.parent)} protocol {o.protocol} prio {o.prio} u32 {keys}"
        if o.redirect_to:
            return f"{head} action mirred egress redirect dev {o.redirect_to}"
        return f"{head} flowid {fmt_handle(o.flowid or 0)}"
    raise TypeError(o)


def tc_text(desired: Desired, *, headers: bool = True) -> str:
    lines: list[str] = []
    for d in desired.devices:
        if headers:
            what = f"{d.direction} on {d.interface}" + (f" (shaped on {d.dev})" if d.dev != d.interface else "")
            lines.append(f"# device {d.dev}: {what}")
        last = None
        for o in d.objects:
            if headers:
                grp = o.rule or ""
                if grp != last and grp:
                    note = getattr(o, "note", "")
                    lines.append(f"#   rule {grp}" + (f": {note}" if note else ""))
                elif grp != last:
                    lines.append("#   netlimit (shared)")
                last = grp
            lines.append(tc_command(o))
    return "\n".join(lines) + ("\n" if lines else "")


# --- the plan -------------------------------------------------------------------


def plan_text(desired: Desired, *, source: str = "", sha256: str = "", backend: str = "restore", why: str = "") -> str:
    """The plan as `netlimit plan` prints it: the packet-filter part in the language of
    `backend` (its `plan_sections`: the nft script, iptables-restore input), then tc.
    `why`: how the backend was chosen (a header line)."""
    chosen = backend_of(backend)
    out: list[str] = []
    head = "# netlimit plan"
    if source:
        head += f" for {source}"
    out.append(head)
    if sha256:
        out.append(f"# sha256 {sha256}")
    if why:
        out.append(f"# backend: {backend} ({why})")
    n_tc = len(desired.tc_objects)
    n_filter, what = chosen.plan_summary(desired)
    out.append(f"# {len(desired.rule_names)} rules -> {what}, {n_tc} tc objects ({', '.join(desired.notes)})")
    if not n_filter and not n_tc and desired.xdp is None:
        out.append("# nothing to install: this file has no network or bandwidth rules")
        return "\n".join(out) + "\n"
    out.extend(chosen.plan_sections(desired))
    tct = tc_text(desired)
    if tct:
        out.append("")
        out.append("# --- tc (run in this order) ---")
        out.append(tct.rstrip("\n"))
    if desired.xdp is not None:
        from .xdp.stage import plan_section

        out.extend(plan_section(desired.xdp))
    return "\n".join(out) + "\n"


def chain_dict(c: IptChain) -> dict[str, Any]:
    return {"family": c.family, "table": c.table, "name": c.name, "rule": c.rule or None}


def rule_dict(r: IptRule) -> dict[str, Any]:
    return {
        "layer": "iptables" if r.family == 4 else "ip6tables",
        "family": r.family,
        "table": r.table,
        "chain": r.chain,
        "rule": r.rule or None,
        "comment": r.comment,
        "position": r.position,
        "spec": rule_spec(r),
        "line": rule_line(r),
        "note": r.note,
    }


def tc_dict(o: TcObject) -> dict[str, Any]:
    d: dict[str, Any] = {"layer": "tc", "rule": o.rule or None, "dev": o.dev, "command": tc_command(o)}
    if isinstance(o, TcLink):
        d.update(object="link", kind=o.kind, for_dev=o.for_dev)
    elif isinstance(o, TcQdisc):
        d.update(object="qdisc", kind=o.kind, handle=fmt_handle(o.handle), parent=o.parent)
        if o.kind == "htb":
            d["default"] = fmt_handle((o.handle & 0xFFFF0000) | o.default_minor)
    elif isinstance(o, TcClass):
        d.update(
            object="class",
            kind="htb",
            classid=fmt_handle(o.classid),
            parent=fmt_handle(o.parent),
            rate_bits=o.rate,
            ceil_bits=o.ceil,
            burst=o.burst,
            cburst=o.cburst,
            quantum=o.quantum,
            note=o.note,
        )
    elif isinstance(o, TcFilter):
        d.update(
            object="filter",
            kind="u32",
            parent=fmt_handle(o.parent),
            protocol=o.protocol,
            prio=o.prio,
            keys=[k.pyroute2() for k in o.keys],
            note=o.note,
        )
        if o.flowid is not None:
            d["flowid"] = fmt_handle(o.flowid)
        if o.redirect_to:
            d["redirect_to"] = o.redirect_to
    return d


def nft_dict(desired: Desired) -> dict[str, Any]:
    t = desired.nft
    return {
        "table": f"{NFT_FAMILY} {NFT_TABLE}",
        "chains": [
            {"name": c.name, "hook": c.hook, "priority": c.priority, "policy": c.policy}
            | ({"devices": list(c.devices)} if c.devices else {})
            for c in t.chains
        ],
        "sets": [
            {"name": s.name, "rule": s.rule or None, "spec": s.spec, "elements": list(s.elements), "comment": s.comment}
            for s in t.sets
        ],
        "rules": [
            {
                "layer": "nftables",
                "family": r.family,
                "chain": r.chain,
                "rule": r.rule or None,
                "comment": r.comment,
                "sets": list(r.sets),
                "text": r.text,
                "note": r.note,
            }
            for r in t.rules
        ],
        "script": nft_text(desired, headers=False),
    }


def plan_dict(desired: Desired, *, source: str = "", sha256: str = "", backend: str = "restore") -> dict[str, Any]:
    out: dict[str, Any] = {
        "file": source or None,
        "sha256": sha256 or None,
        "notes": list(desired.notes),
        "rules": list(desired.rule_names),
    }
    out.update(backend_of(backend).plan_doc(desired))
    if desired.xdp is not None:  # the `xdp:` stage (absent key without one: plans of other files unchanged)
        from .xdp.stage import plan_doc

        out["xdp"] = plan_doc(desired.xdp)
    return out | {
        "tc": {
            "devices": [
                {
                    "dev": d.dev,
                    "interface": d.interface,
                    "direction": d.direction,
                    "objects": [tc_dict(o) for o in d.objects],
                }
                for d in desired.devices
            ],
        },
    }


def plan_json(desired: Desired, **kw: str) -> str:
    return json.dumps(plan_dict(desired, **kw), indent=2) + "\n"
