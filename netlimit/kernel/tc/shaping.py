"""tc backend through pyroute2: HTB trees under root handle 4e4c:, ingress -> IFB.

Import only when a command touches the kernel. Works in the calling thread's
namespace (see netns.run_in_netns).

What netlimit owns on a device: a root qdisc with handle 4e4c: (and so every
class and filter under it), the ingress filter with pref 20044 that redirects
to one of its IFB devices (and the ingress qdisc, when nothing else uses it),
and links named nlifb-* of kind ifb. A foreign root qdisc (any handle other
than 4e4c: or the kernel's default 0:) is never replaced: apply refuses.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass, field
from typing import Any

from ...errors import NetlimitError
from ..objects import (
    IFB_PREFIX,
    TC_INGRESS_PRIO,
    TC_MAJOR,
    Device,
    TcClass,
    TcFilter,
    TcLink,
    TcObject,
    TcQdisc,
    U32Key,
    fmt_handle,
    tc_handle,
)

log = logging.getLogger("netlimit.tc")

ROOT = tc_handle(TC_MAJOR)
INGRESS = 0xFFFF0000
TC_H_ROOT = 0xFFFFFFFF
TC_H_INGRESS = 0xFFFFFFF1
ETH_P = {"ip": 0x0800, "ipv6": 0x86DD, "all": 0x0003}
ETH_P_NAME = {v: k for k, v in ETH_P.items()}


class TcError(NetlimitError):
    def __init__(self, message: str, rule: str | None = None):
        super().__init__(message)
        self.rule = rule


def _ipr():
    from pyroute2 import IPRoute

    return IPRoute()


def _nlerr(exc: Exception) -> str:
    code = getattr(exc, "code", None)
    if code is not None:
        import os

        return f"{os.strerror(code)} (errno {code})" + (
            f": {exc.args[1]}" if len(exc.args) > 1 and exc.args[1] != os.strerror(code) else ""
        )
    return str(exc)


# --- normalised comparison forms ------------------------------------------------------


def _bytes_of(keys) -> tuple[tuple[int, int, int], ...]:
    """u32 keys as (offset, value byte, mask byte) triples: pyroute2 re-packs keys
    byte by byte, so this is the only spelling both sides share."""
    out: dict[int, tuple[int, int]] = {}
    for k in keys:
        for i in range(4):
            shift = 24 - 8 * i
            m = (k.mask >> shift) & 0xFF
            if m:
                out[k.offset + i] = ((k.value >> shift) & 0xFF, m)
    return tuple(sorted((o, v, m) for o, (v, m) in out.items()))


def _buffer(rate_bits: int, burst: int) -> int:
    from pyroute2.netlink.rtnl.tcmsg.common import calc_xmittime

    return calc_xmittime(rate_bits // 8, burst)


def norm(o: TcObject) -> tuple:
    """What diff compares for one object (desired or read back)."""
    if isinstance(o, TcLink):
        return ("link", o.name, o.kind)
    if isinstance(o, TcQdisc):
        return ("qdisc", o.dev, o.kind, o.handle, o.parent, o.default_minor if o.kind == "htb" else 0)
    if isinstance(o, TcClass):
        return (
            "class",
            o.dev,
            o.classid,
            o.parent,
            o.rate // 8,
            o.ceil // 8,
            _buffer(o.rate, o.burst),
            _buffer(o.ceil, o.cburst),
            o.quantum,
        )
    if isinstance(o, TcFilter):
        return ("filter", o.dev, o.parent, o.protocol, o.prio, _bytes_of(o.keys), o.flowid, o.redirect_to)
    raise TypeError(o)


# --- reading -------------------------------------------------------------------------


@dataclass
class LiveTc:
    obj: TcObject
    packets: int = 0
    bytes: int = 0
    drops: int = 0
    overlimits: int = 0
    backlog: int = 0


@dataclass
class TcState:
    links: dict[str, LiveTc] = field(default_factory=dict)  # owned IFB devices by name
    trees: dict[str, list[LiveTc]] = field(default_factory=dict)  # dev -> root qdisc, classes, filters
    ingress: dict[str, list[LiveTc]] = field(default_factory=dict)  # dev -> ingress qdisc + our filter(s)
    foreign_roots: dict[str, str] = field(default_factory=dict)  # dev -> "htb 1:" (not ours, not default)
    ifindex: dict[str, int] = field(default_factory=dict)
    ingress_other_filters: dict[str, int] = field(default_factory=dict)  # dev -> foreign ingress filters

    @property
    def empty(self) -> bool:
        return not self.links and not self.trees and not any(self.ingress.values())

    def objects(self) -> list[LiveTc]:
        out: list[LiveTc] = list(self.links.values())
        for v in self.trees.values():
            out.extend(v)
        for v in self.ingress.values():
            out.extend(v)
        return out


def _stats(msg) -> dict[str, int]:
    s2 = msg.get_attr("TCA_STATS2")
    out = {"packets": 0, "bytes": 0, "drops": 0, "overlimits": 0, "backlog": 0}
    if s2 is None:
        return out
    basic = s2.get_attr("TCA_STATS_BASIC") or {}
    queue = s2.get_attr("TCA_STATS_QUEUE") or {}
    out.update(
        packets=basic.get("packets", 0),
        bytes=basic.get("bytes", 0),
        drops=queue.get("drops", 0),
        overlimits=queue.get("overlimits", 0),
        backlog=queue.get("backlog", 0),
    )
    return out


def _live_keys(sel: dict) -> tuple[U32Key, ...]:
    """Decode u32 keys from pyroute2 0.9.7's reading, which is shifted by one 32-bit
    word (its u32_sel layout is off by 4 bytes): the real mask shows in key_val,
    the real value (little-endian) in key_off, the real offset in key_offmask."""
    keys = []
    for k in sel.get("keys", []):
        mask = k["key_val"] & 0xFFFFFFFF
        val = struct.unpack(">I", struct.pack("<i", k["key_off"]))[0]
        off = k["key_offmask"]
        keys.append(U32Key(val & mask, mask, off))
    return tuple(keys)


def read_state(ipr=None) -> TcState:
    if ipr is None:  # nothing of ours in tc (most hosts): known without importing pyroute2 (0.4 s)
        from .quick import QuickReadError, look

        try:
            seen = look(IFB_PREFIX, ROOT, TC_H_INGRESS, TC_H_ROOT)
        except (
            OSError,
            QuickReadError,
        ) as exc:  # rtnetlink did not answer whole: the full read below says why, or reads
            log.debug("tc: the quick look failed (%s): reading through pyroute2", exc)
            seen = None
        if seen is not None:
            return TcState(foreign_roots={d: f"{k} {fmt_handle(h)}" for d, (k, h) in seen[1].items()}, ifindex=seen[0])
    own = ipr is None
    ipr = ipr or _ipr()
    try:
        return _read_state(ipr)
    finally:
        if own:
            ipr.close()


def _read_state(ipr) -> TcState:
    st = TcState()
    names: dict[int, str] = {}
    for link in ipr.get_links():
        name = link.get_attr("IFLA_IFNAME")
        idx = link["index"]
        names[idx] = name
        st.ifindex[name] = idx
        info = link.get_attr("IFLA_LINKINFO")
        kind = info.get_attr("IFLA_INFO_KIND") if info is not None else None
        if kind == "ifb" and name.startswith(IFB_PREFIX):
            st.links[name] = LiveTc(TcLink(name=name, kind="ifb", for_dev=""))
    for q in ipr.get_qdiscs():
        dev = names.get(q["index"])
        if dev is None:
            continue
        kind = q.get_attr("TCA_KIND")
        if q["parent"] == TC_H_ROOT:
            if q["handle"] == ROOT and kind == "htb":
                opts = q.get_attr("TCA_OPTIONS")
                init = opts.get_attr("TCA_HTB_INIT") if opts is not None else {}
                obj = TcQdisc(
                    dev=dev, kind="htb", handle=ROOT, parent="root", default_minor=(init or {}).get("defcls", 0)
                )
                st.trees[dev] = [LiveTc(obj, **_stats(q))]
            elif q["handle"] >> 16 != 0:
                st.foreign_roots[dev] = f"{kind} {fmt_handle(q['handle'])}"
        elif q["parent"] == TC_H_INGRESS and kind == "ingress":
            st.ingress.setdefault(dev, [])
            st.ingress[dev].append(
                LiveTc(TcQdisc(dev=dev, kind="ingress", handle=INGRESS, parent="ingress"), **_stats(q))
            )
    for dev, lst in st.trees.items():
        idx = st.ifindex[dev]
        for c in ipr.get_classes(index=idx):
            if c["handle"] >> 16 != TC_MAJOR:
                continue
            opts = c.get_attr("TCA_OPTIONS")
            parms = opts.get_attr("TCA_HTB_PARMS") if opts is not None else None
            if parms is None:
                continue
            rate = opts.get_attr("TCA_HTB_RATE64") or parms["rate"]
            ceil = opts.get_attr("TCA_HTB_CEIL64") or parms["ceil"]
            parent = c["parent"] if c["parent"] != TC_H_ROOT else ROOT
            cls = TcClass(
                dev=dev,
                classid=c["handle"],
                parent=parent,
                rate=rate * 8,
                ceil=ceil * 8,
                burst=_ticks_to_bytes(parms["buffer"], rate),
                cburst=_ticks_to_bytes(parms["cbuffer"], ceil),
                quantum=parms["quantum"],
            )
            lst.append(LiveTc(cls, **_stats(c)))
        lst.extend(LiveTc(f) for f in _read_filters(ipr, idx, dev, ROOT, names))
    for dev in list(st.ingress):
        idx = st.ifindex[dev]
        fl = list(_read_filters(ipr, idx, dev, INGRESS, names))
        ours = [f for f in fl if f.prio == TC_INGRESS_PRIO and (f.redirect_to or "").startswith(IFB_PREFIX)]
        st.ingress_other_filters[dev] = len(fl) - len(ours)
        if ours:
            st.ingress[dev].extend(LiveTc(f) for f in ours)
        else:
            del st.ingress[dev]  # an ingress qdisc without our filter is not ours
    return st


def _ticks_to_bytes(ticks: int, rate_bytes: int) -> int:
    from pyroute2.netlink.rtnl.tcmsg.common import tick_in_usec

    if not rate_bytes:
        return 0
    return int(round(ticks / tick_in_usec * rate_bytes / 1e6))


def _read_filters(ipr, idx: int, dev: str, parent: int, names: dict[int, str]):
    try:
        msgs = ipr.get_filters(index=idx, parent=parent)
    except Exception:  # pyroute2 raises anything for a device gone or a filter it cannot parse
        return
    for f in msgs:
        opts = f.get_attr("TCA_OPTIONS")
        if f.get_attr("TCA_KIND") != "u32" or opts is None:
            continue
        sel = opts.get_attr("TCA_U32_SEL")
        if sel is None:
            continue  # hash table headers, not filters
        info = f["info"]
        prio, proto = info >> 16, struct.unpack(">H", struct.pack("<H", info & 0xFFFF))[0]
        flowid = opts.get_attr("TCA_U32_CLASSID")
        redirect = None
        act = opts.get_attr("TCA_U32_ACT")
        if act is not None:
            for _, a in act.get("attrs", []):
                try:
                    if a.get_attr("TCA_ACT_KIND") == "mirred":
                        p = a.get_attr("TCA_ACT_OPTIONS").get_attr("TCA_MIRRED_PARMS")
                        redirect = names.get(p["ifindex"], f"ifindex {p['ifindex']}")
                except AttributeError:
                    continue
        yield TcFilter(
            dev=dev,
            parent=parent,
            protocol=ETH_P_NAME.get(proto, hex(proto)),
            prio=prio,
            keys=_live_keys(sel),
            flowid=flowid if redirect is None else None,
            redirect_to=redirect,
        )


# --- diff ---------------------------------------------------------------------------


@dataclass
class TcPlan:
    add_links: list[TcLink] = field(default_factory=list)
    del_links: list[str] = field(default_factory=list)
    trees: dict[str, Device] = field(default_factory=dict)  # dev -> desired device to (re)build
    remove_trees: list[str] = field(default_factory=list)
    ingress: dict[str, TcFilter] = field(default_factory=dict)  # interface -> desired redirect filter
    remove_ingress: list[str] = field(default_factory=list)
    changes: list[tuple[str, str, str, str]] = field(default_factory=list)  # (op, dev, rule, command)

    @property
    def empty(self) -> bool:
        return not (
            self.add_links or self.del_links or self.trees or self.remove_trees or self.ingress or self.remove_ingress
        )

    def lines(self) -> list[str]:
        return [f"{op} {'tc':9} {cmd}" for op, _dev, _rule, cmd in self.changes]


def diff(devices: tuple[Device, ...], st: TcState) -> TcPlan:
    from ..render import tc_command

    plan = TcPlan()
    want_links = {o.name: o for d in devices for o in d.objects if isinstance(o, TcLink)}
    for name, link in want_links.items():
        if name not in st.links:
            plan.add_links.append(link)
            plan.changes.append(("+", name, "", tc_command(link)))
    want_trees: dict[str, list[TcObject]] = {}
    want_ingress: dict[str, TcFilter] = {}
    by_dev: dict[str, Device] = {}
    for d in devices:
        tree: list[TcObject] = [
            o
            for o in d.objects
            if not isinstance(o, TcLink)
            and o.dev == d.dev
            and not (isinstance(o, TcFilter) and o.redirect_to)
            and not (isinstance(o, TcQdisc) and o.kind == "ingress")
        ]
        if tree:
            want_trees[d.dev] = tree
            by_dev[d.dev] = d
        for o in d.objects:
            if isinstance(o, TcFilter) and o.redirect_to:
                want_ingress[o.dev] = o
    for dev, want in want_trees.items():
        live = [x.obj for x in st.trees.get(dev, [])]
        wn = sorted(norm(o) for o in want)
        ln = sorted(norm(o) for o in live)
        if wn != ln or (dev in want_links and dev not in st.links):
            plan.trees[dev] = by_dev[dev]
            wset, lset = set(wn), set(ln)
            for o in live:
                if norm(o) not in wset:
                    plan.changes.append(("-", dev, o.rule, tc_command(o)))
            for o in want:
                if norm(o) not in lset or dev not in st.trees:
                    plan.changes.append(("+", dev, o.rule, tc_command(o)))
    for dev in st.trees:
        if dev not in want_trees:
            plan.remove_trees.append(dev)
            plan.changes.append(("-", dev, "", f"tc qdisc del dev {dev} root handle {fmt_handle(ROOT)}"))
    for dev, f in want_ingress.items():
        live = [x.obj for x in st.ingress.get(dev, []) if isinstance(x.obj, TcFilter)]
        if [norm(o) for o in live] != [norm(f)]:
            plan.ingress[dev] = f
            for o in live:
                plan.changes.append(("-", dev, "", tc_command(o)))
            if not st.ingress.get(dev) and dev not in st.ingress_other_filters:
                plan.changes.append(("+", dev, "", f"tc qdisc add dev {dev} handle ffff: ingress"))
            plan.changes.append(("+", dev, "", tc_command(f)))
    for dev in st.ingress:
        if dev not in want_ingress:
            plan.remove_ingress.append(dev)
            plan.changes.append(("-", dev, "", f"tc filter del dev {dev} ingress pref {TC_INGRESS_PRIO}"))
    for name in st.links:
        if name not in want_links:
            plan.del_links.append(name)
            plan.changes.append(("-", name, "", f"ip link del {name}"))
    return plan


# --- writing ---------------------------------------------------------------------------


def _idx(ipr, dev: str, rule: str | None = None) -> int:
    found = ipr.link_lookup(ifname=dev)
    if not found:
        raise TcError(f"device {dev!r} does not exist here" + (f" (bandwidth rule {rule!r})" if rule else ""), rule)
    return found[0]


def _add(ipr, o: TcObject, ifindex_of) -> None:
    idx = ifindex_of(o.dev, o.rule)
    if isinstance(o, TcQdisc):
        if o.kind == "htb":
            ipr.tc("add", "htb", idx, o.handle, default=o.default_minor, r2q=10)
        else:
            ipr.tc("add", "ingress", idx, INGRESS)
    elif isinstance(o, TcClass):
        ipr.tc(
            "add-class",
            "htb",
            idx,
            o.classid,
            parent=o.parent,
            rate=o.rate // 8,
            ceil=o.ceil // 8,
            burst=o.burst,
            cburst=o.cburst,
            quantum=o.quantum,
        )
    elif isinstance(o, TcFilter):
        kw = dict(parent=o.parent, prio=o.prio, protocol=ETH_P[o.protocol], keys=[k.pyroute2() for k in o.keys])
        if o.redirect_to:
            ifb = ifindex_of(o.redirect_to, o.rule)
            ipr.tc(
                "add-filter",
                "u32",
                idx,
                target=0,
                action=dict(kind="mirred", direction="egress", action="redirect", ifindex=ifb),
                **kw,
            )
        else:
            ipr.tc("add-filter", "u32", idx, target=o.flowid, **kw)
    else:
        raise TypeError(o)


def _del_root(ipr, idx: int) -> None:
    from pyroute2.netlink.exceptions import NetlinkError

    try:
        ipr.tc("del", "htb", idx, ROOT, parent=TC_H_ROOT)
    except NetlinkError as exc:
        if exc.code not in (2, 22):  # already gone
            raise


def _del_ingress_filter(ipr, idx: int, st_other: int) -> None:
    from pyroute2.netlink.exceptions import NetlinkError

    try:
        ipr.tc("del-filter", index=idx, parent=INGRESS, prio=TC_INGRESS_PRIO, protocol=ETH_P["all"])
    except NetlinkError as exc:
        if exc.code not in (2, 22):
            raise
    if not st_other:
        try:
            ipr.tc("del", "ingress", idx, INGRESS)
        except NetlinkError as exc:
            if exc.code not in (2, 22):
                raise


def apply(plan: TcPlan, st: TcState) -> None:
    """Carry out the plan. Raises TcError naming the rule and the kernel's answer."""
    if plan.empty:
        return
    from pyroute2.netlink.exceptions import NetlinkError

    with _ipr() as ipr:

        def ifindex_of(dev: str, rule: str | None = None) -> int:
            return _idx(ipr, dev, rule)

        cur_obj: list[TcObject | None] = [None]
        try:
            for link in plan.add_links:
                cur_obj[0] = link
                ipr.link("add", ifname=link.name, kind="ifb")
                ipr.link("set", index=ifindex_of(link.name), state="up")
            for dev, device in plan.trees.items():
                if dev in st.foreign_roots:
                    rule = next((o.rule for o in device.objects if o.rule), None)
                    raise TcError(
                        f"{dev} has a root qdisc netlimit does not own ({st.foreign_roots[dev]}); "
                        f"netlimit never replaces it: remove it first (tc qdisc del dev {dev} root)",
                        rule,
                    )
                idx = ifindex_of(dev, next((o.rule for o in device.objects if o.rule), None))
                if dev in st.trees:
                    _del_root(ipr, idx)
                for o in device.objects:
                    if isinstance(o, TcLink) or o.dev != dev:
                        continue
                    cur_obj[0] = o
                    _add(ipr, o, ifindex_of)
            for dev, f in plan.ingress.items():
                idx = ifindex_of(dev)
                if dev in st.ingress:
                    _del_ingress_filter(ipr, idx, 1)  # keep the qdisc: we re-add our filter at once
                cur_obj[0] = TcQdisc(dev=dev, kind="ingress", handle=INGRESS, parent="ingress")
                created = False
                if dev not in st.ingress and not st.ingress_other_filters.get(dev):
                    try:
                        ipr.tc("add", "ingress", idx, INGRESS)
                        created = True
                    except NetlinkError as exc:
                        if exc.code != 17:  # EEXIST: a foreign (empty) ingress qdisc: share it
                            raise
                cur_obj[0] = f
                try:
                    _add(ipr, f, ifindex_of)
                except Exception:  # whatever failed: the qdisc just created is taken back, then re-raised
                    if created:  # without our filter the qdisc would look foreign: take it back now
                        _del_ingress_filter(ipr, idx, 0)
                    raise
            for dev in plan.remove_trees:
                if dev in st.ifindex:
                    _del_root(ipr, st.ifindex[dev])
            for dev in plan.remove_ingress:
                if dev in st.ifindex:
                    _del_ingress_filter(ipr, st.ifindex[dev], st.ingress_other_filters.get(dev, 0))
            for name in plan.del_links:
                found = ipr.link_lookup(ifname=name)
                if found:
                    ipr.link("del", index=found[0])
        except NetlinkError as exc:
            from ..render import tc_command

            failed = cur_obj[0]
            what = tc_command(failed) if failed is not None else "tc"
            rule = failed.rule if failed is not None and failed.rule else None
            raise TcError(f"the kernel refused '{what}': {_nlerr(exc)}", rule) from exc


def flush(st: TcState | None = None) -> int:
    st = st or read_state()
    plan = diff((), st)
    apply(plan, st)
    return len(st.objects())


def restore(snapshot: TcState) -> None:
    """Rollback: make the owned tc objects equal to `snapshot` again."""
    devices: list[Device] = []
    for dev, lst in snapshot.trees.items():
        objs: list[TcObject] = []
        if dev in snapshot.links:
            objs.append(snapshot.links[dev].obj)
        objs.extend(x.obj for x in lst)
        devices.append(Device(dev=dev, interface=dev, direction="egress", objects=tuple(objs)))
    for dev, lst in snapshot.ingress.items():
        devices.append(
            Device(
                dev=dev,
                interface=dev,
                direction="ingress",
                objects=tuple(x.obj for x in lst if isinstance(x.obj, TcFilter)),
            )
        )
    for name, link in snapshot.links.items():
        if name not in snapshot.trees:
            devices.append(Device(dev=name, interface=name, direction="egress", objects=(link.obj,)))
    cur = read_state()
    apply(diff(tuple(devices), cur), cur)


# --- list --------------------------------------------------------------------------------


def row_key(o: TcObject) -> str:
    """How a list row names a tc object (tc objects carry no comment: reconcile maps
    these keys to rule names)."""
    if isinstance(o, TcClass):
        return f"class {o.dev} {o.classid:#x}"
    if isinstance(o, TcFilter):
        return f"filter {o.dev} {o.parent:#x} {o.prio}"
    return f"{'link' if isinstance(o, TcLink) else 'qdisc'} {o.dev}"


def rows(st: TcState) -> list[dict[str, Any]]:
    """`list` rows for every owned tc object, with its counters."""
    from ..render import tc_command

    out: list[dict[str, Any]] = []
    for x in st.objects():
        o = x.obj
        kind = {TcLink: "link", TcQdisc: "qdisc", TcClass: "class", TcFilter: "filter"}.get(type(o), "?")
        out.append(
            {
                "rule": o.rule or "",
                "layer": "tc",
                "object": tc_command(o),
                "dev": o.dev,
                "kind": kind,
                "key": row_key(o),
                "packets": x.packets,
                "bytes": x.bytes,
                "dropped": x.drops,
                "overlimits": x.overlimits,
                "backlog": x.backlog,
                "norm": repr(norm(o)),  # reconcile.list_owned: the plan's spelling of an equal object
            }
        )
    return out
