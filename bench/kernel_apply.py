"""Section 5: time to apply N network rules, netlimit vs iptables-restore.

Both sides load the same rule set into their own fresh network namespace
(``nlbench-<pid>-...``, deleted in ``finally``; nothing runs in the machine's
own namespace):

* netlimit: ``reconcile.apply(compile_config(...), netns)`` with the default
  iptables backend (``restore``: iptables-legacy-save + one
  iptables-legacy-restore per family; see netlimit/kernel/backends/restore.py)
  -- read the owned state, diff, write the difference; a full apply into an
  empty namespace, the same file again (no-op), and the file with one rule's
  limit changed. netlimit's spelling caches (savefmt.canon, render's match
  text) are emptied before every timed apply, so each figure is what a fresh
  ``netlimit apply`` process pays, not a warmed-up daemon.
* netlimit with ``--backend python-iptables`` (the fallback): extra rows, one
  round, up to 1,000 rules (5,000 would add minutes).
* peer: ``iptables-legacy-restore --noflush`` and ``ip6tables-legacy-restore
  --noflush`` fed ``render.iptables_save_text`` of the same compiled rules
  (what ``netlimit plan`` prints).  Reloading a file that declares the chain
  replaces the chain's rules, so "no-op" and "one change" for the peer are
  the whole file loaded again (it has no diff).

Rules are dual-stack (one network rule = one IPv4 + one IPv6 kernel rule),
alternating hashlimit and connlimit, each on its own port.
"""

from __future__ import annotations

import os
import subprocess
import time
from typing import Any

from .common import Mode, Section, median, need, row

GOALS = {"full_1000": 1.0, "noop_1000": 0.2, "change_1000": 0.3}


def rules_yaml(n: int, changed: int | None = None) -> str:
    out = ["version: 1", 'exempt: [127.0.0.0/8, "::1/128"]', "network:"]
    for i in range(n):
        port = 10000 + i
        if i % 2 == 0:
            rate = 101 if i == changed else 100
            out.append(
                f"  - {{name: r{i}, protocol: tcp, ports: [{port}], limit: {rate}/second, burst: 10, "
                f"per: source, htable_size: 256}}"
            )
        else:
            conns = 21 if i == changed else 20
            out.append(f"  - {{name: r{i}, protocol: tcp, ports: [{port}], max_connections: {conns}}}")
    return "\n".join(out) + "\n"


def _desired(text: str):
    from netlimit.config.validate import load_string
    from netlimit.kernel.compile import compile_config

    return compile_config(load_string(text, "<bench>").config)


def _sh(*cmd: str, input: str | None = None, timeout: float = 120) -> None:
    p = subprocess.run(list(cmd), input=input, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {p.stderr.strip()[:500]}")


def _restore(ns: str, v4: str, v6: str) -> float:
    t0 = time.perf_counter()
    _sh("ip", "netns", "exec", ns, "iptables-legacy-restore", "--noflush", input=v4)
    _sh("ip", "netns", "exec", ns, "ip6tables-legacy-restore", "--noflush", input=v6)
    return time.perf_counter() - t0


def _no_jumps(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("-I "))


def _clean_peer(ns: str) -> None:
    for tool in ("iptables-legacy", "ip6tables-legacy"):
        _sh("ip", "netns", "exec", ns, tool, "-F")
        _sh("ip", "netns", "exec", ns, tool, "-X")


def _count_rules(ns: str) -> int:
    n = 0
    for tool in ("iptables-legacy-save", "ip6tables-legacy-save"):
        out = subprocess.run(["ip", "netns", "exec", ns, tool], capture_output=True, text=True, timeout=60).stdout
        n += sum(1 for line in out.splitlines() if line.startswith("-A"))
    return n


def _cold() -> None:
    """Forget netlimit's spelling caches: time a fresh process's apply."""
    from netlimit.kernel import render, savefmt

    savefmt.canon.cache_clear()
    savefmt._net_c.cache_clear()
    render._match_text.cache_clear()


def _netlimit_three(reconcile, ns: str, d0, d1, backend: str | None) -> tuple[list[float], dict[str, Any]]:
    """Full apply into an empty namespace, the same again, one rule changed: seconds and phases."""
    reconcile.flush(ns, backend=backend)
    secs: list[float] = []
    phases: dict[str, Any] = {}
    for what, d in (("full", d0), ("noop", d0), ("change", d1)):
        _cold()
        t0 = time.perf_counter()
        res = reconcile.apply(d, ns, backend=backend)
        secs.append(time.perf_counter() - t0)
        phases[what] = res.timings
        if what == "full":
            assert res.changed
        elif what == "noop":
            assert not res.changed, "a re-apply of the same file changed something"
        else:
            assert res.changes.counts()["add"] == 2, res.changes.lines()[:6]
    return secs, phases


def run(mode: Mode) -> Section:
    from netlimit.kernel import reconcile
    from netlimit.kernel.render import iptables_save_text

    backend = reconcile.backend_name()
    sec = Section(
        "kernel", f"Kernel apply: netlimit apply (backend {backend}) vs iptables-legacy-restore --noflush (seconds)"
    )
    if os.geteuid() != 0:
        raise RuntimeError("the kernel section needs root (it creates network namespaces)")
    for tool in ("ip", "iptables-legacy-restore", "ip6tables-legacy-restore", "iptables-legacy-save"):
        need(tool, "iptables")
    sizes = mode.pick([20, 100], [100, 1000, 5000])
    rounds = {n: mode.pick(1, 3 if n <= 1000 else 1) for n in sizes}
    base = f"nlbench-{os.getpid()}"
    ns_nl, ns_peer = f"{base}-knl", f"{base}-kpeer"
    curve: dict[str, Any] = {"sizes": sizes, "netlimit_full": [], "peer_full": []}
    try:
        for ns in (ns_nl, ns_peer):
            _sh("ip", "netns", "add", ns)
        for n in sizes:
            mid = n // 2 if (n // 2) % 2 == 0 else n // 2 + 1
            d0, d1 = _desired(rules_yaml(n)), _desired(rules_yaml(n, changed=mid))
            v4, v6 = iptables_save_text(d0, 4, headers=False), iptables_save_text(d0, 6, headers=False)
            # a reload must not insert the jumps from INPUT a second time (--noflush keeps INPUT)
            c4, c6 = (_no_jumps(iptables_save_text(d1, f, headers=False)) for f in (4, 6))
            r4, r6 = _no_jumps(v4), _no_jumps(v6)
            t: dict[str, list[float]] = {
                k: []
                for k in (
                    "nl_full",
                    "nl_noop",
                    "nl_change",
                    "peer_full",
                    "peer_reload",
                    "peer_change",
                    "pyipt_full",
                    "pyipt_noop",
                    "pyipt_change",
                )
            }
            kernel_rules = 0
            phases: dict[str, dict[str, float]] = {}  # netlimit's own split: read, diff, iptables, tc
            for r in range(rounds[n]):
                sides = ("nl", "peer") if r % 2 == 0 else ("peer", "nl")
                for side in sides:
                    if side == "nl":
                        secs, phases = _netlimit_three(reconcile, ns_nl, d0, d1, backend)
                        for k, x in zip(("nl_full", "nl_noop", "nl_change"), secs):
                            t[k].append(x)
                        kernel_rules = _count_rules(ns_nl)
                        if r == 0 and backend != "python-iptables" and n <= 1000:
                            secs, _ = _netlimit_three(reconcile, ns_nl, d0, d1, "python-iptables")
                            for k, x in zip(("pyipt_full", "pyipt_noop", "pyipt_change"), secs):
                                t[k].append(x)
                            reconcile.flush(ns_nl, backend="python-iptables")
                    else:
                        _clean_peer(ns_peer)
                        t["peer_full"].append(_restore(ns_peer, v4, v6))
                        t["peer_reload"].append(_restore(ns_peer, r4, r6))
                        t["peer_change"].append(_restore(ns_peer, c4, c6))
                        peer_rules = _count_rules(ns_peer)
                        assert peer_rules == kernel_rules or not kernel_rules, (peer_rules, kernel_rules)
            reconcile.flush(ns_nl)
            _clean_peer(ns_peer)
            m = {k: median(v) for k, v in t.items()}
            curve["netlimit_full"].append(m["nl_full"])
            curve["peer_full"].append(m["peer_full"])
            sec.details[str(n)] = {
                "kernel_rules": kernel_rules,
                "rounds": rounds[n],
                "backend": backend,
                "netlimit_phases_last_round": {k: {p: round(x, 4) for p, x in v.items()} for k, v in phases.items()},
                "seconds": {k: [round(x, 4) for x in v] for k, v in t.items()},
            }
            peer = "iptables-legacy-restore"
            for what, nk, pk, goal_key in (
                ("full apply", "nl_full", "peer_full", "full"),
                ("no-op re-apply", "nl_noop", "peer_reload", "noop"),
                ("one rule changed", "nl_change", "peer_change", "change"),
            ):
                g = GOALS.get(f"{goal_key}_{n}")
                sec.rows.append(
                    row(
                        f"{what}, {n} rules ({kernel_rules} kernel rules)",
                        m[nk],
                        m[pk],
                        unit="s",
                        better="lower",
                        peer_name=peer + (" (whole file again)" if goal_key != "full" else ""),
                        goal=f"<= {g} s" if g else "",
                        met=(m[nk] <= g) if g else None,
                    )
                )
            if t["pyipt_full"]:
                for what, nk, pk in (
                    ("full apply", "pyipt_full", "peer_full"),
                    ("no-op re-apply", "pyipt_noop", "peer_reload"),
                    ("one rule changed", "pyipt_change", "peer_change"),
                ):
                    sec.rows.append(
                        row(
                            f"{what}, {n} rules, --backend python-iptables (1 round)",
                            m[nk],
                            m[pk],
                            unit="s",
                            better="lower",
                            peer_name=peer + (" (whole file again)" if nk != "pyipt_full" else ""),
                            note="the fallback backend, for comparison",
                        )
                    )
        sec.details["backend"] = backend
        sec.details["curve"] = curve
    finally:
        for ns in (ns_nl, ns_peer):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
    return sec
