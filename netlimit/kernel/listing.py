"""`netlimit list` for people: one line per rule, as `ufw status verbose` reads.

    RULE        LAYER     MATCH                      LIMIT                          PACKETS  DROPS  ENTRIES
    (exempt)    nftables  from 127.0.0.0/8, ::1/128  never limited                        0      -        -
    ssh-guard   nftables  tcp dport 22 new           3/minute per source (recent)        12     12        1  # office

The match and the limit are the file's (the rule as written, in the file's
units), taken from the file given with ``--file`` or else from what the last
apply remembered (/run/netlimit/rules-<netns>.json, beside the tc names); the
counters and set sizes are the kernel's, summed over the rule's objects.  No
line is longer than ``WIDTH`` characters: a long cell ends in "…", the whole
text is in ``list --json`` (and the raw objects in ``list --verbose``).

tc reads its objects back spelled otherwise than ``plan`` writes them (u32
keys re-packed byte by byte, a burst rounded through the kernel's ticks): an
object that compares equal to the planned one (the comparison ``diff`` makes)
is printed in the plan's spelling, so nothing looks like drift that is not.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ..config.model import BandwidthRule, Config, NetworkRule
from ..config.units import format_bandwidth, format_size
from .netns import prune_state_files
from .objects import Desired
from .registry import backend as backend_of

WIDTH = 120
#: the widest each text column gets (the numbers take 7)
CAPS = {"rule": 18, "layer": 8, "match": 32, "limit": 30}
NAMES_DIR = "/run/netlimit"
#: rows of these "rules" are netlimit's own plumbing (tc roots, IFBs, jumps): only in --verbose
PLUMBING = ("", "(jump)", "(netlimit)")


def _nets(nets: list[Any]) -> str:
    return ",".join(str(n) for n in nets)


def network_match(r: NetworkRule) -> str:
    parts: list[str] = [r.protocol if r.protocol != "all" else "any"]
    if r.ports:
        parts.append("dport " + ",".join(str(p) for p in r.ports))
    if r.new_connections or r.max_connections is not None:
        parts.append("new")
    if r.sources:
        parts.append("from " + _nets(r.sources))
    if r.destinations:
        parts.append("to " + _nets(r.destinations))
    if r.interface:
        parts.append("in " + r.interface)
    if r.chain == "forward":
        parts.append("(forward)")
    return " ".join(parts)


def network_limit(r: NetworkRule) -> str:
    per: str = r.per
    if r.source_prefix is not None and per in ("source", "source+port"):
        per += f"/{r.source_prefix}"
    if r.max_connections is not None:
        text = f"{r.max_connections} conns per {per}"
    else:
        text = f"{r.limit}"
        if r.burst is not None:
            text += f" burst {r.burst}"
        text += f" per {per}" + (" (recent)" if r.method == "recent" else "")
    if r.action != "drop":
        text += " " + {"reject": "reject", "log": "log only"}[r.action]
    if r.escalate is not None:
        text += " +ban"
    return text


def bandwidth_match(b: BandwidthRule) -> str:
    parts: list[str] = [b.direction, b.interface]
    if b.protocol != "all":
        parts.append(b.protocol)
    if b.ports:
        parts.append(("sport " if b.direction == "egress" else "dport ") + ",".join(str(p) for p in b.ports))
    if b.sources:
        parts.append(("to " if b.direction == "egress" else "from ") + _nets(b.sources))
    if b.whole_interface:
        parts.append("all traffic")
    return " ".join(parts)


def bandwidth_limit(b: BandwidthRule) -> str:
    return format_bandwidth(b.rate) + (f" burst {format_size(b.burst)}" if b.burst is not None else "")


def summarize(config: Config) -> tuple[dict[str, Any], ...]:
    """Each rule as `list` shows it (file order, the exempt list first)."""
    out: list[dict[str, Any]] = []
    if config.exempt:
        out.append(
            {"rule": "(exempt)", "kind": "network", "match": "from " + _nets(config.exempt), "limit": "never limited"}
        )
    if config.deny:  # matched right after exempt, before the bans and every limit
        out.append(
            {"rule": "(deny)", "kind": "network", "match": "from " + _nets(config.deny), "limit": "always dropped"}
        )
    if config.bans_on:
        out.append({"rule": "(bans)", "kind": "network", "match": "the ban list's prefixes", "limit": "dropped"})
    for r in config.network:
        line = {"rule": r.name, "kind": "network", "match": network_match(r), "limit": network_limit(r)}
        out.append(line | {"comment": r.comment})
    for b in config.bandwidth:
        out.append(
            {
                "rule": b.name,
                "kind": "bandwidth",
                "match": bandwidth_match(b),
                "limit": bandwidth_limit(b),
                "comment": b.comment,
            }
        )
    return tuple({k: v for k, v in d.items() if v is not None} for d in out)


def tc_spelling(desired: Desired) -> dict[str, str]:
    """What diff compares of each planned tc object -> the plan's spelling of it."""
    from .render import tc_command
    from .tc.shaping import norm

    return {repr(norm(o)): tc_command(o) for o in desired.tc_objects}


# --- what the last apply remembered ----------------------------------------------------


def _path(netns: str | None) -> str:
    return os.path.join(NAMES_DIR, f"rules-{netns or '_root'}.json")


def save(netns: str | None, desired: Desired) -> None:
    """Remember the rules as written and the plan's tc spelling (only for `list`)."""
    doc = {"rules": list(desired.summary), "tc": tc_spelling(desired)}
    if desired.xdp is not None:  # slot -> rule name: the XDP counters are per slot
        doc["xdp_slots"] = list(desired.xdp.slot_rule)
    try:
        prune_state_files(NAMES_DIR, "rules-")
        os.makedirs(NAMES_DIR, exist_ok=True)
        tmp = _path(netns) + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(doc, fh, indent=1, sort_keys=True)
        os.replace(tmp, _path(netns))
    except OSError:
        pass


def load(netns: str | None) -> dict[str, Any]:
    try:
        with open(_path(netns)) as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def forget(netns: str | None) -> None:
    try:
        os.unlink(_path(netns))
    except OSError:
        pass


# --- the lines -------------------------------------------------------------------------


def rule_lines(rows: list[dict[str, Any]], rules: list[dict[str, Any]], backend: str) -> list[dict[str, Any]]:
    """One entry per rule: the file's description and the kernel's counters summed.
    A rule the kernel has no object of keeps ``packets`` None ("-"); a rule only the
    kernel knows (applied from another file) gets "?" for what the file would say."""
    agg: dict[str, dict[str, Any]] = {}
    for r in rows:
        name = r.get("rule") or ""
        if name in PLUMBING:
            continue
        a = agg.setdefault(name, {"layers": [], "packets": 0, "bytes": 0, "dropped": 0, "tables": {}})
        if r["layer"] not in a["layers"]:
            a["layers"].append(r["layer"])
        a["packets"] += int(r.get("packets") or 0)
        a["bytes"] += int(r.get("bytes") or 0)
        a["dropped"] += int(r.get("dropped") or 0)
        if r.get("table"):
            a["tables"][r["table"]] = r.get("table_entries")
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for d in rules:
        name = d["rule"]
        seen.add(name)
        out.append(_line(name, d, agg.get(name), backend))
    for name, a in agg.items():
        if name not in seen:
            out.append(_line(name, {"match": "?", "limit": "?"}, a, backend))
    return out


def _line(name: str, d: dict[str, Any], a: dict[str, Any] | None, backend: str) -> dict[str, Any]:
    if a is not None:
        layers = a["layers"]
        layer = "iptables" if set(layers) <= {"iptables", "ip6tables"} else "+".join(layers)
    else:
        layer = "tc" if d.get("kind") == "bandwidth" else backend_of(backend).layer
    entries: int | None = None
    if a is not None and a["tables"]:
        sizes = list(a["tables"].values())
        entries = None if any(n is None for n in sizes) else sum(sizes)
    line = {
        "rule": name,
        "layer": layer,
        "match": d.get("match", "?"),
        "limit": d.get("limit", "?"),
        "packets": a["packets"] if a is not None else None,
        "bytes": a["bytes"] if a is not None else None,
        "dropped": a["dropped"] if a is not None else None,
        "entries": entries,
        "tables": a["tables"] if a is not None else {},
        "in_kernel": a is not None,
    }
    if d.get("comment"):
        line["comment"] = d["comment"]
    return line


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def _num(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, div in (("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if n >= 10 * div:
            return f"{n // div}{unit}"
    return str(n)


def widths(lines: list[dict[str, Any]]) -> tuple[dict[str, int], int]:
    """Column widths: each as wide as its widest cell, capped; with comments, MATCH and
    LIMIT give up room (down to 20 each) so that the comment fits in WIDTH too."""
    head = {"rule": "RULE", "layer": "LAYER", "match": "MATCH", "limit": "LIMIT"}
    w = {k: min(CAPS[k], max(len(head[k]), *(len(str(x[k])) for x in lines))) for k in CAPS}
    longest = max((len(x.get("comment") or "") for x in lines), default=0)
    fixed = w["rule"] + w["layer"] + 3 * 2 + NUMS + 4  # the gaps, the numbers, "  # "
    comment = min(longest, max(COMMENT_MIN, WIDTH - fixed - w["match"] - w["limit"]))
    if comment:
        while fixed + w["match"] + w["limit"] + comment > WIDTH:
            k = "match" if w["match"] >= w["limit"] else "limit"
            if w[k] <= 20:
                comment = WIDTH - fixed - w["match"] - w["limit"]
                break
            w[k] -= 1
    return w, comment


#: a comment gets at least this room (MATCH and LIMIT give it up); the rest is cut with "…"
COMMENT_MIN = 12
#: "  PACKETS   DROPS ENTRIES"
NUMS = 2 + 7 + 1 + 7 + 1 + 7


def format_lines(lines: list[dict[str, Any]]) -> str:
    """The table: one line per rule, none longer than WIDTH."""
    w, cw = widths(lines)

    def row(cells: dict[str, str], nums: tuple[str, str, str], comment: str | None) -> str:
        text = "  ".join(_cut(cells[k], w[k]).ljust(w[k]) for k in CAPS)
        text += f"  {nums[0]:>7} {nums[1]:>7} {nums[2]:>7}"
        if comment and cw >= 4:
            text += "  # " + _cut(comment, cw)
        return text.rstrip()

    out = [
        row(
            {"rule": "RULE", "layer": "LAYER", "match": "MATCH", "limit": "LIMIT"},
            ("PACKETS", "DROPS", "ENTRIES"),
            None,
        )
    ]
    for x in lines:
        nums = (_num(x["packets"]), _num(x["dropped"]), _num(x["entries"]) if x["tables"] else "-")
        out.append(row({k: str(x[k]) for k in CAPS}, nums, x.get("comment")))
    return "\n".join(out)
