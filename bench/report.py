"""latest.json -> a Markdown table per section, and a PNG of the kernel apply
curve when matplotlib is installed (the ``bench`` extra)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


def _num(x: Any, unit: str = "") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if unit == "s":
        return f"{x:.3f}"
    if unit in ("ms",):
        return f"{x:.2f}"
    ax = abs(x)
    if ax >= 1000:
        return f"{x:,.0f}"
    if ax >= 100:
        return f"{x:.0f}"
    if ax >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def markdown(doc: dict, png: str | None = None) -> str:
    m = doc.get("machine", {})
    lines = [
        f"# netlimit benchmarks ({doc.get('mode')} run, {doc.get('started')}, {doc.get('seconds')} s)",
        "",
        f"Python {m.get('python')}, kernel {m.get('kernel')}, {m.get('cpus')} CPUs, load average at start "
        f"{m.get('loadavg_at_start')}, git {m.get('git')}. The machine is shared and noisy: each figure was "
        "measured beside its peer in the same run (interleaved rounds where they can alternate); trust the "
        "ratios more than the absolute numbers. Ratio > 1 means netlimit is ahead (higher throughput, or "
        "lower time / latency / memory).",
        "",
    ]
    from .versions import markdown_line

    run_peers = doc.get("peers")
    if run_peers:
        lines += [markdown_line(run_peers, doc.get("pins")), ""]
    else:
        lines += ["Peers: not recorded (a run from before bench/versions.py).", ""]
    for name, sec in doc.get("sections", {}).items():
        lines.append(f"## {sec.get('title') or name}")
        lines.append("")
        if sec.get("error"):
            lines.append(f"**Failed:** `{sec['error']}`")
            lines.append("")
            continue
        lines.append("| case | netlimit | peer | unit | ratio | goal | met | notes |")
        lines.append("|---|---:|---:|---|---:|---|---|---|")
        for r in sec.get("rows", []):
            met = {True: "yes", False: "**NO**", None: ""}[r.get("met")]
            ratio = "—" if r.get("ratio") is None else f"{r['ratio']:.2f}x"
            peer = f"{_num(r.get('peer'), r.get('unit'))} ({r.get('peer_name')})"
            lines.append(
                f"| {r['case']} | {_num(r.get('netlimit'), r.get('unit'))} | {peer} | {r.get('unit')} | "
                f"{ratio} | {r.get('goal') or ''} | {met} | {r.get('note') or ''} |"
            )
        what = sec.get("details", {}).get("what")
        lines.append("")
        if what:
            lines.append(f"<details><summary>what is measured</summary>\n\n{what}\n\n</details>")
            lines.append("")
        sec_peers = sec.get("peers")
        if not sec_peers and run_peers:
            lines.append("_peers of this section: not recorded (measured before bench/versions.py)_")
            lines.append("")
        elif sec_peers != run_peers:
            diff = ", ".join(f"{k} {v}" for k, v in sec_peers.items() if (run_peers or {}).get(k) != v)
            lines.append(f"_measured in an earlier run, with: {diff}_")
            lines.append("")
        lines.append(f"_{sec.get('seconds')} s_")
        lines.append("")
    if png:
        lines.append(f"![kernel apply time]({png})")
        lines.append("")
    return "\n".join(lines)


def plot(doc: dict, out: Path) -> str | None:
    """kernel_apply.png: full-apply seconds vs number of rules, both tools (log-log)."""
    curve = doc.get("sections", {}).get("kernel", {}).get("details", {}).get("curve")
    if not curve:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    ax.plot(curve["sizes"], curve["netlimit_full"], "o-", label="netlimit apply (read + diff + write)")
    ax.plot(curve["sizes"], curve["peer_full"], "s-", label="iptables-legacy-restore --noflush (v4 + v6)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("network rules in the file (x2 kernel rules: IPv4 + IPv6)")
    ax.set_ylabel("full apply into an empty namespace (s)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    name = "kernel_apply.png"
    fig.savefig(out / name)
    plt.close(fig)
    return name
