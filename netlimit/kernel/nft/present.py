"""What the nftables family shows of itself: `plan`'s sections, `top`'s hot entries, a
file's warnings under nftables. Called through its backend (nft/backend.py)."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

from ..hot import MAX_LINES
from ..objects import NFT_FAMILY, NFT_TABLE, Desired
from ..render import nft_dict, nft_text


def plan_summary(desired: Desired) -> tuple[int, str]:
    t = desired.nft
    return len(t.rules), f"{len(t.rules)} nftables rules, {len(t.sets)} sets, {len(t.chains)} chains"


def plan_sections(desired: Desired) -> list[str]:
    if not desired.nft.rules:
        return []
    return [
        "",
        f"# --- nftables (table {NFT_FAMILY} {NFT_TABLE}, priority filter - 10; "
        "paste into `nft -f -` where the table does not exist yet) ---",
        *([f"# {desired.nft.stage}"] if desired.nft.stage else []),
        nft_text(desired).rstrip("\n"),
    ]


def plan_doc(desired: Desired) -> dict[str, Any]:
    doc: dict[str, Any] = {"backend": "nftables", "nftables": nft_dict(desired)}
    if desired.nft.stage:
        doc["stage"] = desired.nft.stage
    return doc


def warnings(loaded: Any) -> list[Any]:
    from ...config.validate import recent_bucket_warnings

    return recent_bucket_warnings(loaded)


def hot_entries() -> list[dict[str, Any]]:
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
