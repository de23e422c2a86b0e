"""Section 5: time to apply N network rules, netlimit vs iptables-restore.

Both sides load the same rule set into their own fresh network namespace
(``nlbench-<pid>-...``, deleted in ``finally``; nothing runs in the machine's
own namespace):

* netlimit: ``reconcile.apply(compile_config(...), netns)`` -- read the owned
  state, diff, one commit per family; a full apply into an empty namespace,
  the same file again (no-op), and the file with one rule's limit changed.
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
    out = ["version: 1", "exempt: [127.0.0.0/8, \"::1/128\"]", "network:"]
    for i in range(n):
        port = 10000 + i
        if i % 2 == 0:
            rate = 101 if i == changed else 100
            out.append(f"  - {{name: r{i}, protocol: tcp, ports: [{port}], limit: {rate}/second, burst: 10, "
                       f"per: source, htable_size: 256}}")
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


def run(mode: Mode) -> Section:
    from netlimit.kernel import reconcile
    from netlimit.kernel.render import iptables_save_text

    sec = Section("kernel", "Kernel apply: netlimit apply vs iptables-legacy-restore --noflush (seconds)")
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
            t: dict[str, list[float]] = {k: [] for k in ("nl_full", "nl_noop", "nl_change", "peer_full",
                                                           "peer_reload", "peer_change")}
            kernel_rules = 0
            phases: dict[str, dict[str, float]] = {}  # netlimit's own split: read, diff, iptables, tc
            for r in range(rounds[n]):
                sides = ("nl", "peer") if r % 2 == 0 else ("peer", "nl")
                for side in sides:
                    if side == "nl":
                        reconcile.flush(ns_nl)
                        t0 = time.perf_counter()
                        res = reconcile.apply(d0, ns_nl)
                        t["nl_full"].append(time.perf_counter() - t0)
                        phases["full"] = res.timings
                        assert res.changed
                        t0 = time.perf_counter()
                        res = reconcile.apply(d0, ns_nl)
                        t["nl_noop"].append(time.perf_counter() - t0)
                        phases["noop"] = res.timings
                        assert not res.changed, "a re-apply of the same file changed something"
                        t0 = time.perf_counter()
                        res = reconcile.apply(d1, ns_nl)
                        t["nl_change"].append(time.perf_counter() - t0)
                        phases["change"] = res.timings
                        assert res.changes.counts()["add"] == 2, res.changes.lines()[:6]
                        kernel_rules = _count_rules(ns_nl)
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
            sec.details[str(n)] = {"kernel_rules": kernel_rules, "rounds": rounds[n],
                                   "netlimit_phases_last_round": {k: {p: round(x, 4) for p, x in v.items()}
                                                                  for k, v in phases.items()},
                                   "seconds": {k: [round(x, 4) for x in v] for k, v in t.items()}}
            peer = "iptables-legacy-restore"
            for what, nk, pk, goal_key in (("full apply", "nl_full", "peer_full", "full"),
                                           ("no-op re-apply", "nl_noop", "peer_reload", "noop"),
                                           ("one rule changed", "nl_change", "peer_change", "change")):
                g = GOALS.get(f"{goal_key}_{n}")
                sec.rows.append(row(f"{what}, {n} rules ({kernel_rules} kernel rules)", m[nk], m[pk], unit="s",
                                    better="lower", peer_name=peer + (" (whole file again)" if goal_key != "full"
                                                                      else ""),
                                    goal=f"<= {g} s" if g else "", met=(m[nk] <= g) if g else None))
        sec.details["curve"] = curve
    finally:
        for ns in (ns_nl, ns_peer):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
    return sec
