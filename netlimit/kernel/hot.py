"""The kernel's per-source state behind netlimit's rules, busiest first (for
`netlimit top`): hashlimit buckets (/proc/net/ipt_hashlimit, ip6t_hashlimit), recent
lists (/proc/net/xt_recent) and the elements of table inet netlimit's dynamic sets, each
read by its backend (`FilterBackend.hot`). Read-only; in the namespace given."""

from __future__ import annotations

from typing import Any

from .netns import run_in_netns
from .registry import backend as backend_of

MAX_LINES = 20_000  # lines read per table: a table is bounded by its htable-max, this bounds us


def proc_lines(path: str):
    """Up to MAX_LINES lines of a /proc file; none if it is not there."""
    try:
        with open(path) as fh:
            for i, line in enumerate(fh):
                if i >= MAX_LINES:
                    return
                yield line
    except OSError:
        return


def hot_entries(netns: str | None, backend: str | None, rule_names: list[str], limit: int = 10) -> list[dict[str, Any]]:
    """The `limit` busiest per-source entries of netlimit's rules: {rule, table, source,
    score, detail}, busiest first."""
    chosen = backend_of(backend)
    rows = run_in_netns(netns, lambda: chosen.hot(rule_names))
    from . import listing
    from .xdp import stage as xdp

    rows += xdp.hot(netns, listing.load(netns).get("xdp_slots", []))  # the `early: true` rules' buckets
    rows.sort(key=lambda r: -r["score"])
    return rows[:limit]
