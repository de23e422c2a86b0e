"""The kernel's per-source state behind netlimit's rules, busiest first (for
`netlimit top`): hashlimit buckets (/proc/net/ipt_hashlimit, ip6t_hashlimit), recent
lists (/proc/net/xt_recent) and the elements of table inet netlimit's dynamic sets.
Read-only; in the namespace given."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

from ..config.validate import hashlimit_name
from .netns import proc_net, run_in_netns

MAX_LINES = 20_000  # lines read per table: a table is bounded by its htable-max, this bounds us


def _lines(path: str):
    """Up to MAX_LINES lines of a /proc file; none if it is not there."""
    try:
        with open(path) as fh:
            for i, line in enumerate(fh):
                if i >= MAX_LINES:
                    return
                yield line
    except OSError:
        return


def _hashlimit(names: dict[str, str]) -> list[dict[str, Any]]:
    """Buckets with the least credit left: the sources being limited now."""
    out = []
    for d in ("ipt_hashlimit", "ip6t_hashlimit"):
        for table, rule in names.items():
            for line in _lines(proc_net(d, table)):
                # "<expires> <src>:<sport>-><dst>:<dport> <credit> <credit_cap> <cost>"
                f = line.split()
                try:
                    credit, cap = int(f[2]), int(f[3])
                except (ValueError, IndexError):
                    continue
                used = 1.0 - credit / cap if cap else 0.0
                src = f[1].split("->")[0].rsplit(":", 1)[0]
                row = {"rule": rule, "table": "hashlimit", "source": src, "score": round(used, 3)}
                out.append(row | {"detail": f"{used:.0%} of the burst used"})
    return out


def _recent(names: dict[str, str]) -> list[dict[str, Any]]:
    """Sources with the most remembered packets in a recent list."""
    out = []
    for table, rule in names.items():
        for line in _lines(proc_net("xt_recent", table)):
            # "src=1.2.3.4 ttl: 64 last_seen: 4295 oldest_pkt: 3 4294, 4295, 4295"
            if not line.startswith("src=") or "oldest_pkt:" not in line:
                continue
            hits = len(line.split("oldest_pkt:", 1)[1].split(","))
            src = line.split()[0][4:]
            detail = f"{hits} packets remembered"
            out.append({"rule": rule, "table": "recent", "source": src, "score": hits, "detail": detail})
    return out


def _nft_sets() -> list[dict[str, Any]]:
    """Elements of table inet netlimit's sets with a timeout. A ban set's elements are
    sources over their limit now (busiest); in the others, each packet of a source
    refreshes its element, so the most time left means the most recently active."""
    p = subprocess.run(
        ["nft", "-j", "list", "table", "inet", "netlimit"],
        capture_output=True, text=True, timeout=10, env=dict(os.environ, LC_ALL="C"),
    )  # fmt: skip
    if p.returncode != 0:
        return []
    out = []
    for item in json.loads(p.stdout).get("nftables", []):
        s = item.get("set")
        if not s or "timeout" not in s.get("flags", []):
            continue
        rule = str(s.get("comment", "")).removeprefix("netlimit:").split(" ")[0] or s["name"]
        timeout = s.get("timeout") or 0
        banned = s["name"].startswith("ban")
        for e in s.get("elem", [])[:MAX_LINES]:
            el = e.get("elem") if isinstance(e, dict) else None
            if not isinstance(el, dict):
                continue
            val = el.get("val")
            left = el.get("expires", 0)
            if banned:
                score, detail = 2.0, f"over the limit, {left} s left"
            else:
                score = left / timeout if timeout else 0.0
                detail = f"last packet {max(0, timeout - left)} s ago"
            src = val if isinstance(val, str) else json.dumps(val)
            out.append({"rule": rule, "table": s["name"], "source": src, "score": score, "detail": detail})
    return out


def hot_entries(netns: str | None, backend: str, rule_names: list[str], limit: int = 10) -> list[dict[str, Any]]:
    """The `limit` busiest per-source entries of netlimit's rules: {rule, table, source,
    score, detail}, busiest first."""

    def work() -> list[dict[str, Any]]:
        if backend == "nftables":
            return _nft_sets()
        return _hashlimit({hashlimit_name(n): n for n in rule_names}) + _recent({n: n for n in rule_names})

    rows = run_in_netns(netns, work)
    rows.sort(key=lambda r: -r["score"])
    return rows[:limit]
