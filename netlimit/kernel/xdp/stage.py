"""The `xdp:` stage as reconcile sees it: compile (config -> XdpDesired), read (what
netlimit's program, attachments and maps hold now), plan (the difference, as plan
lines), write, flush and the `list` rows (layer "xdp").

Whoever calls this is the kernel's shared modules (compile, reconcile, render,
listing), never another family. Every kernel call goes through XdpPath (path.py);
nothing is kept in the process: a daemon restart reads the pins back.

What the stage owns in a namespace: one program attached to xdp.interfaces, its
rule table (the `early: true` rules), and the exempt and deny prefix lists. The bans
map is the daemon's ban writer's (kernel/banset.py), never rewritten here.
"""

from __future__ import annotations

import ipaddress
import os
import struct
import time
from dataclasses import dataclass, field
from typing import Any

from netlimit.config.model import Config
from netlimit.kernel.xdp.libbpf import XdpError
from netlimit.kernel.xdp.maps import BUCKET_KEY, Network, XdpRule, decode_rule, encode_rules
from netlimit.kernel.xdp.path import PROG_NAME, XdpPath, pin_dir_for
from netlimit.kernel.xdp.translate import from_config

LAYER = "xdp"


@dataclass(frozen=True)
class XdpDesired:
    """What the XDP program of a namespace should hold for one file."""

    interfaces: tuple[str, ...]
    mode: str
    rules: tuple[XdpRule, ...] = ()
    slot_rule: tuple[str, ...] = ()  # slot -> network rule name (counters -> `list`)
    exempt: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()
    bans: bool = False  # the file uses bans: the daemon fills the bans map


def compile_xdp(config: Config) -> XdpDesired | None:
    """The stage of `config`; None without an `xdp:` section. EarlyRefused (validate
    refused it already) when an early rule cannot run in XDP."""
    if config.xdp is None:
        return None
    t = from_config(config)
    return XdpDesired(
        interfaces=tuple(config.xdp.interfaces),
        mode=config.xdp.mode,
        rules=tuple(t.rules),
        slot_rule=tuple(t.slot_rule),
        exempt=tuple(t.exempt),
        deny=tuple(t.deny),
        bans=config.bans_on,
    )


# --- read ---------------------------------------------------------------------------


@dataclass
class XdpState:
    """What netlimit's XDP path of a namespace holds now."""

    netns: str | None
    loaded: bool = False  # a program is pinned
    prog_id: int | None = None
    attached: dict[str, tuple[int, str]] = field(default_factory=dict)  # ifname -> (prog id, mode)
    foreign: list[tuple[str, int, str]] = field(default_factory=list)  # (ifname, prog id, name)
    rules: list[dict[str, Any]] = field(default_factory=list)  # decoded slots
    exempt: set[Network] = field(default_factory=set)
    deny: set[Network] = field(default_factory=set)
    unreadable: str | None = None  # why the maps could not be read (a half-gone pin dir)

    @property
    def empty(self) -> bool:
        return not self.loaded and not self.attached

    def count(self) -> int:
        """Owned objects: the pinned program and each attachment."""
        return int(self.loaded) + len(self.attached)


def _pinned(netns: str | None) -> bool:
    return os.path.isdir(pin_dir_for(netns))


def read(netns: str | None) -> XdpState:
    """netlimit's program, attachments and maps in `netns` (nothing pinned and no
    libbpf: an empty state, so hosts without XDP keep working)."""
    st = XdpState(netns)
    with XdpPath(netns) as p:
        try:
            for a in p.attachments():
                st.attached[a.ifname] = (a.prog_id, a.mode)
            st.foreign = p.foreign()
        except (XdpError, OSError) as exc:
            if not _pinned(netns):
                return st  # no libbpf here and nothing of ours pinned: nothing to read
            st.unreadable = str(exc)
        st.loaded = p.loaded()
        if not st.loaded:
            return st
        try:
            st.prog_id = p.prog_id()
            st.rules = p.rules()
            st.exempt = set(p.prefixes("exempt"))
            st.deny = set(p.prefixes("deny"))
        except (XdpError, OSError) as exc:  # a map unpinned by hand: drift, rewritten by apply
            st.unreadable = str(exc)
    return st


# --- plan ---------------------------------------------------------------------------


@dataclass
class XdpPlan:
    netns: str | None
    desired: XdpDesired | None
    steps: list[str] = field(default_factory=list)
    attach: bool = False  # load + attach/replace on every interface (sync)
    refused: str | None = None  # a foreign program on a listed interface: apply changes nothing

    @property
    def empty(self) -> bool:
        return not self.steps and self.refused is None

    def lines(self) -> list[str]:
        return self.steps + ([f"! xdp: {self.refused}"] if self.refused else [])


def _nets(prefixes: tuple[str, ...]) -> set[Network]:
    return {ipaddress.ip_network(p, strict=False) for p in prefixes}


def _list_diff(kind: str, want: set[Network], have: set[Network]) -> list[str]:
    add, gone = want - have, have - want
    if not add and not gone:
        return []
    return [f"~ xdp: {kind} map: +{len(add)} -{len(gone)} prefixes ({len(want)} wanted)"]


def plan(desired: XdpDesired | None, state: XdpState) -> XdpPlan:
    """What makes `state` equal to `desired` (None: remove netlimit's XDP path)."""
    out = XdpPlan(state.netns, desired)
    if desired is None:
        if not state.empty:
            out.steps += [f"- xdp: detach {PROG_NAME} from {i}" for i in sorted(state.attached)]
            out.steps.append(f"- xdp: unpin {pin_dir_for(state.netns)}")
        return out
    foreign = [f for f in state.foreign if f[0] in desired.interfaces]
    if foreign:
        ifname, pid, name = foreign[0]
        out.refused = (
            f"interface {ifname} already runs XDP program id {pid} named {name!r}, which is not netlimit's; "
            f"netlimit never replaces a foreign XDP program — remove it (ip link set dev {ifname} xdp off) "
            f"or drop {ifname} from xdp.interfaces"
        )
        return out
    if state.unreadable:
        out.steps.append(f"~ xdp: reload the program and its maps ({state.unreadable})")
        out.attach = True
    if not state.loaded:
        out.steps.append(f"+ xdp: load {PROG_NAME}, pin its maps under {pin_dir_for(state.netns)}")
        out.attach = True
    for ifname in desired.interfaces:
        have = state.attached.get(ifname)
        if have is None:
            out.steps.append(f"+ xdp: attach {PROG_NAME} to {ifname} (mode {desired.mode})")
            out.attach = True
        elif desired.mode != "auto" and have[1] != desired.mode:
            out.steps.append(f"~ xdp: {ifname}: mode {have[1]} -> {desired.mode}")
            out.attach = True
        elif state.prog_id is not None and have[0] != state.prog_id:
            out.steps.append(f"~ xdp: {ifname}: replace program id {have[0]} by the pinned {state.prog_id}")
            out.attach = True
    for ifname in sorted(set(state.attached) - set(desired.interfaces)):
        out.steps.append(f"- xdp: detach {PROG_NAME} from {ifname}")
        out.attach = True
    want_rules = [decode_rule(s) for s in encode_rules(list(desired.rules))[: len(desired.rules)]]
    if state.rules != want_rules:
        names = ", ".join(dict.fromkeys(desired.slot_rule)) or "none"
        out.steps.append(f"~ xdp: rules table: {len(desired.rules)} slots ({names})")
    out.steps += _list_diff("exempt", _nets(desired.exempt), state.exempt)
    out.steps += _list_diff("deny", _nets(desired.deny), state.deny)
    return out


# --- write --------------------------------------------------------------------------


def write(p: XdpPlan) -> None:
    """Carry out `p`: attach/replace atomically (XdpPath.sync: the maps are kept, a
    foreign program refused before anything changes), then the rule table and the
    exempt and deny lists. The bans map is left to the daemon's ban writer."""
    if p.refused:
        raise XdpError(p.refused, 16)
    if p.empty:
        return
    with XdpPath(p.netns) as path:
        if p.desired is None:
            path.flush()
            return
        d = p.desired
        if p.attach or not path.loaded():
            path.sync(list(d.interfaces), d.mode)
        path.set_rules(list(d.rules))
        path.set_prefixes("exempt", d.exempt)
        path.set_prefixes("deny", d.deny)


def flush(netns: str | None) -> list[str]:
    """Detach netlimit's program everywhere in `netns` and unpin its directory."""
    st = read(netns)
    if st.empty and not _pinned(netns):
        return []
    with XdpPath(netns) as path:
        return path.flush()


def restore(state: XdpState | None) -> None:
    """Roll back to `state` as far as XDP allows: where nothing of netlimit's was there,
    detach and unpin what an apply added. An older program, rule table or lists that
    were replaced are not put back (the pinned maps kept the bans and buckets)."""
    if state is not None and state.empty:
        flush(state.netns)


# --- plan text and list rows ----------------------------------------------------------


def plan_section(d: XdpDesired) -> list[str]:
    """`netlimit plan`'s XDP section: interfaces, mode, the early rules, the lists."""
    out = ["", f"# --- xdp: {PROG_NAME} on {', '.join(d.interfaces)} (mode {d.mode}) ---"]
    out.append("# order: exempt passes, deny and bans drop, then the early rules' per-source buckets")
    out.append(f"exempt: {len(d.exempt)} prefixes" + (f" ({', '.join(d.exempt[:8])})" if d.exempt else ""))
    out.append(f"deny: {len(d.deny)} prefixes" + (f" ({', '.join(d.deny[:8])})" if d.deny else ""))
    out.append("bans: filled by netlimitd from the ban list" if d.bans else "bans: (the file uses no bans)")
    for slot, (name, r) in enumerate(zip(d.slot_rule, d.rules, strict=True)):
        proto = r.protocol or "any"
        ports = "any port" if r.dports is None else f"port {r.dports[0]}-{r.dports[1]}"
        out.append(
            f"rule {slot} {name}: {r.limit}/{r.period_s:g}s burst {r.burst}, {proto} {ports}, "
            f"per /{r.prefix4} (IPv4) /{r.prefix6} (IPv6)" + (f", IPv{r.family} only" if r.family else "")
        )
    return out


def plan_doc(d: XdpDesired) -> dict[str, Any]:
    return {
        "interfaces": list(d.interfaces),
        "mode": d.mode,
        "exempt": list(d.exempt),
        "deny": list(d.deny),
        "bans": d.bans,
        "rules": [
            {"rule": name, "slot": i} | {k: v for k, v in r.__dict__.items() if k != "name"}
            for i, (name, r) in enumerate(zip(d.slot_rule, d.rules, strict=True))
        ],
    }


def hot(netns: str | None, slot_rule: list[str], max_entries: int = 20_000) -> list[dict[str, Any]]:
    """`top`'s per-source entries of the early rules: one per bucket (a masked source),
    scored by how much of its burst is in use now (the bucket's `tat` ahead of now, over
    burst x interval; above the tolerance the source is over its limit). At most
    `max_entries` buckets are read."""
    if not _pinned(netns):
        return []
    out: list[dict[str, Any]] = []
    with XdpPath(netns) as p:
        if not p.loaded():
            return []
        try:
            rules = p.rules()
            b = p.map("buckets")
            now = time.monotonic_ns()  # bpf_ktime_get_ns is CLOCK_MONOTONIC
            for n, key in enumerate(b.iter_keys()):
                if n >= max_entries:
                    break
                raw = b.lookup(key)
                slot, fam, addr = BUCKET_KEY.unpack(key)
                if raw is None or slot >= len(rules) or fam not in (4, 6):
                    continue
                r = rules[slot]
                ahead = max(0, struct.unpack("<Q", raw)[0] - now)
                score = ahead / max(1, r["tolerance_ns"] + r["interval_ns"])
                plen = r["prefix4"] if fam == 4 else r["prefix6"]
                src = ipaddress.ip_network((addr[:4] if fam == 4 else addr, plen))
                over = ahead > r["tolerance_ns"]
                out.append(
                    {
                        "rule": slot_rule[slot] if slot < len(slot_rule) else f"(xdp slot {slot})",
                        "table": "xdp buckets",
                        "source": str(src),
                        "score": score,
                        "detail": "over the limit" if over else f"{min(score, 1.0):.0%} of its burst in use",
                    }
                )
        except (XdpError, OSError):  # a map unpinned by hand: drift, `apply` repairs it
            return out
    return out


def rows(netns: str | None, slot_rule: list[str]) -> list[dict[str, Any]]:
    """`list` rows of the XDP path: per early rule passed/dropped (summed over its
    slots and CPUs), and the exempt/deny/bans drops (layer "xdp")."""
    if not _pinned(netns):
        return []
    with XdpPath(netns) as p:
        if not p.loaded():
            return []
        try:
            c = p.counters()
        except (XdpError, OSError):  # a map unpinned by hand: drift, `apply` repairs it
            return []
    out: list[dict[str, Any]] = []
    for i, (passed, dropped) in enumerate(c.rules):
        name = slot_rule[i] if i < len(slot_rule) else f"(xdp slot {i})"
        out.append(
            {
                "rule": name,
                "layer": LAYER,
                "object": f"xdp rule slot {i}",
                "packets": passed + dropped,
                "bytes": 0,
                "dropped": dropped,
                "passed": passed,
            }
        )
    for name, packets, dropped in (
        ("(exempt)", c.exempt, 0),
        ("(deny)", c.denied, c.denied),
        ("(bans)", c.banned, c.banned),
    ):
        if packets:  # only what the program saw: the file may have no such list
            out.append(
                {
                    "rule": name,
                    "layer": LAYER,
                    "object": f"xdp {name}",
                    "packets": packets,
                    "bytes": 0,
                    "dropped": dropped,
                }
            )
    return out
