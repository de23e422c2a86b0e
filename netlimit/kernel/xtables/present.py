"""What the legacy x_tables family shows of itself: `plan`'s sections, `top`'s hot
entries (hashlimit buckets and recent lists from /proc). Called through its backends
(xtables/backend.py)."""

from __future__ import annotations

from typing import Any

from ...config.validate import hashlimit_name
from ..hot import proc_lines
from ..netns import proc_net
from ..objects import Desired
from ..render import FAMILY_TOOL, chain_dict, iptables_save_text, rule_dict


def plan_summary(desired: Desired) -> tuple[int, str]:
    n = len(desired.rules)
    return n, f"{n} iptables/ip6tables rules, {len(desired.chains)} chains"


def plan_sections(desired: Desired) -> list[str]:
    out: list[str] = []
    if desired.ipsets:
        out.append("")
        out.append("# --- ipsets (the ban sets: paste into `ipset restore -exist` before the rules) ---")
        out.extend(f"create {s.name} {s.type} {s.header}" for s in desired.ipsets)
    for fam in (4, 6):
        text = iptables_save_text(desired, fam)
        if text:
            out.append("")
            out.append(
                f"# --- {FAMILY_TOOL[fam]} (legacy x_tables; paste into {FAMILY_TOOL[fam]}-legacy-restore "
                f"--noflush) ---"
            )
            out.append(text.rstrip("\n"))
    return out


def plan_doc(desired: Desired) -> dict[str, Any]:
    out: dict[str, Any] = {
        "iptables": {
            "chains": [chain_dict(c) for c in desired.chains],
            "rules": [rule_dict(r) for r in desired.rules],
            "restore": {FAMILY_TOOL[f]: iptables_save_text(desired, f, headers=False) for f in (4, 6)},
        }
    }
    if desired.ipsets:
        out["ipsets"] = [
            {"name": s.name, "type": s.type, "header": s.header, "rule": s.rule or None} for s in desired.ipsets
        ]
    return out


def hot_entries(rule_names: list[str]) -> list[dict[str, Any]]:
    return hashlimit_entries({hashlimit_name(n): n for n in rule_names}) + recent_entries({n: n for n in rule_names})


def host_note(netns: str | None = None) -> str | None:
    """A clear word when a legacy backend writes on a host whose `iptables` is the nf_tables variant."""
    from ..registry import host_iptables_variant

    variant, version = host_iptables_variant()
    if variant != "nf_tables":
        return None
    ns = f"ip netns exec {netns} " if netns else ""
    return (
        f"note: this host's `iptables` is the nf_tables variant ({version}). netlimit installs its rules "
        "into the legacy x_tables (iptables-legacy), which the kernel evaluates as well: "
        f"`{ns}iptables -S` and `nft list ruleset` will NOT show them (iptables -S only warns "
        f"'iptables-legacy tables present'); see them with `{ns}iptables-legacy -S`, "
        f"`{ns}ip6tables-legacy -S`, or `netlimit list`, which reads the kernel. "
        "`--backend nftables` (or `backend: nftables`) puts them where this host's tools look."
    )


def hashlimit_entries(names: dict[str, str]) -> list[dict[str, Any]]:
    """Buckets with the least credit left: the sources being limited now."""
    out = []
    for d in ("ipt_hashlimit", "ip6t_hashlimit"):
        for table, rule in names.items():
            for line in proc_lines(proc_net(d, table)):
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


def recent_entries(names: dict[str, str]) -> list[dict[str, Any]]:
    """Sources with the most remembered packets in a recent list."""
    out = []
    for table, rule in names.items():
        for line in proc_lines(proc_net("xt_recent", table)):
            # "src=1.2.3.4 ttl: 64 last_seen: 4295 oldest_pkt: 3 4294, 4295, 4295"
            if not line.startswith("src=") or "oldest_pkt:" not in line:
                continue
            hits = len(line.split("oldest_pkt:", 1)[1].split(","))
            src = line.split()[0][4:]
            detail = f"{hits} packets remembered"
            out.append({"rule": rule, "table": "recent", "source": src, "score": hits, "detail": detail})
    return out
