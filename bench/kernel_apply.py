"""Section 5: time to apply N network rules, netlimit vs the tools it drives.

Every side loads the same rule set into its own fresh network namespace
(``nlbench-<pid>-...``, deleted in ``finally``; nothing runs in the machine's
own namespace):

* netlimit ``--backend restore``: ``reconcile.apply(compile_config(...), netns)``
  through iptables-legacy-save + one iptables-legacy-restore per family (see
  netlimit/kernel/xtables/restore.py) -- read the owned state, diff, write the
  difference; a full apply into an empty namespace, the same file again (no-op),
  and the file with one rule's limit changed. netlimit's spelling caches
  (savefmt.canon, render's match text) are emptied before every timed apply, so
  each figure is what a fresh ``netlimit apply`` process pays, not a warmed-up
  daemon. Peer: ``iptables-legacy-restore --noflush`` and ``ip6tables-legacy-restore
  --noflush`` fed ``render.iptables_save_text`` of the same compiled rules (what
  ``netlimit plan`` prints). Reloading a file that declares the chain replaces the
  chain's rules, so "no-op" and "one change" for the peer are the whole file loaded
  again (it has no diff).
* netlimit ``--backend nftables`` (up to 1,000 rules): the same three applies
  into table inet netlimit (kernel/nft/backend.py: netlink read, `nft -f` of the
  difference). Peer: ``nft -f`` of the same table as ``netlimit plan --backend
  nftables`` prints it; "no-op" and "one change" for the peer are the whole table
  again in one transaction (``delete table`` + the table), as raw nft reloads one.
  Goals (issue 17): full <= the restore backend's full, no-op <= 0.1 s, one
  change <= 0.2 s.
* netlimit with ``--backend python-iptables`` (the fallback): extra rows, one
  round, up to 1,000 rules (5,000 would add minutes).

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
NFT_GOALS = {"noop_1000": 0.1, "change_1000": 0.2}  # full: <= the restore backend's full, same run
NFT_MAX_RULES = 1000


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


def _nft(ns: str, script: str) -> float:
    t0 = time.perf_counter()
    _sh("ip", "netns", "exec", ns, "nft", "-f", "-", input=script)
    return time.perf_counter() - t0


def _count_nft_rules(ns: str) -> int:
    out = subprocess.run(
        ["ip", "netns", "exec", ns, "nft", "list", "table", "inet", "netlimit"],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    rules = [line.strip() for line in out.splitlines() if 'comment "netlimit:' in line]
    return sum(1 for line in rules if not line.startswith(("set ", "comment ")))  # not the sets, the table's comment


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
        else:  # the changed rule's IPv4 and IPv6 rules (nftables: and their two sets)
            assert res.changes.counts()["add"] == (4 if backend == "nftables" else 2), res.changes.lines()[:6]
    return secs, phases


def run(mode: Mode) -> Section:
    from netlimit.kernel import reconcile
    from netlimit.kernel.render import iptables_save_text, nft_text

    backend = "restore"
    sec = Section(
        "kernel",
        "Kernel apply: netlimit apply --backend restore vs iptables-legacy-restore --noflush, "
        "--backend nftables vs nft -f (seconds)",
    )
    if os.geteuid() != 0:
        raise RuntimeError("the kernel section needs root (it creates network namespaces)")
    for tool in ("ip", "iptables-legacy-restore", "ip6tables-legacy-restore", "iptables-legacy-save"):
        need(tool, "iptables")
    need("nft", "nftables")
    sizes = mode.pick([20, 100], [100, 1000, 5000])
    rounds = {n: mode.pick(1, 3 if n <= 1000 else 1) for n in sizes}
    base = f"nlbench-{os.getpid()}"
    ns_nl, ns_peer, ns_nft, ns_nftpeer = f"{base}-knl", f"{base}-kpeer", f"{base}-knft", f"{base}-knftp"
    curve: dict[str, Any] = {"sizes": sizes, "netlimit_full": [], "peer_full": []}
    try:
        for ns in (ns_nl, ns_peer, ns_nft, ns_nftpeer):
            _sh("ip", "netns", "add", ns)
        for n in sizes:
            mid = n // 2 if (n // 2) % 2 == 0 else n // 2 + 1
            d0, d1 = _desired(rules_yaml(n)), _desired(rules_yaml(n, changed=mid))
            v4, v6 = iptables_save_text(d0, 4, headers=False), iptables_save_text(d0, 6, headers=False)
            # a reload must not insert the jumps from INPUT a second time (--noflush keeps INPUT)
            c4, c6 = (_no_jumps(iptables_save_text(d1, f, headers=False)) for f in (4, 6))
            r4, r6 = _no_jumps(v4), _no_jumps(v6)
            # raw nft: the table as `plan` prints it; a reload replaces it whole in one transaction
            reload = "table inet netlimit {}\ndelete table inet netlimit\n"
            nft0, nft1 = nft_text(d0, headers=False), nft_text(d1, headers=False)
            with_nft = n <= NFT_MAX_RULES
            keys = ("full", "noop", "change")
            t: dict[str, list[float]] = {
                f"{side}_{k}": []
                for side in ("nl", "peer", "pyipt", "nft", "nftpeer")
                for k in ("full", "noop", "change", "reload")
            }
            kernel_rules = nft_rules = 0
            phases: dict[str, dict[str, float]] = {}  # netlimit's own split: read, diff, filter, tc
            nft_phases: dict[str, dict[str, float]] = {}
            for r in range(rounds[n]):
                order = ["nl", "peer", "nft", "nftpeer"] if r % 2 == 0 else ["nftpeer", "nft", "peer", "nl"]
                for side in order:
                    if side == "nl":
                        secs, phases = _netlimit_three(reconcile, ns_nl, d0, d1, backend)
                        for k, x in zip(keys, secs):
                            t[f"nl_{k}"].append(x)
                        kernel_rules = _count_rules(ns_nl)
                        if r == 0 and n <= 1000:
                            secs, _ = _netlimit_three(reconcile, ns_nl, d0, d1, "python-iptables")
                            for k, x in zip(keys, secs):
                                t[f"pyipt_{k}"].append(x)
                            reconcile.flush(ns_nl, backend="python-iptables")
                    elif side == "peer":
                        _clean_peer(ns_peer)
                        t["peer_full"].append(_restore(ns_peer, v4, v6))
                        t["peer_noop"].append(_restore(ns_peer, r4, r6))
                        t["peer_change"].append(_restore(ns_peer, c4, c6))
                        peer_rules = _count_rules(ns_peer)
                        assert peer_rules == kernel_rules or not kernel_rules, (peer_rules, kernel_rules)
                    elif side == "nft" and with_nft:
                        secs, nft_phases = _netlimit_three(reconcile, ns_nft, d0, d1, "nftables")
                        for k, x in zip(keys, secs):
                            t[f"nft_{k}"].append(x)
                        nft_rules = _count_nft_rules(ns_nft)
                    elif side == "nftpeer" and with_nft:
                        subprocess.run(
                            ["ip", "netns", "exec", ns_nftpeer, "nft", "delete", "table", "inet", "netlimit"],
                            capture_output=True,
                            timeout=120,
                        )
                        t["nftpeer_full"].append(_nft(ns_nftpeer, nft0))
                        t["nftpeer_noop"].append(_nft(ns_nftpeer, reload + nft0))
                        t["nftpeer_change"].append(_nft(ns_nftpeer, reload + nft1))
                        peer = _count_nft_rules(ns_nftpeer)
                        assert peer == nft_rules or not nft_rules, (peer, nft_rules)
            reconcile.flush(ns_nl, backend="restore")
            reconcile.flush(ns_nft, backend="nftables")
            _clean_peer(ns_peer)
            m = {k: median(v) for k, v in t.items()}
            curve["netlimit_full"].append(m["nl_full"])
            curve["peer_full"].append(m["peer_full"])
            sec.details[str(n)] = {
                "kernel_rules": kernel_rules,
                "nft_rules": nft_rules,
                "rounds": rounds[n],
                "netlimit_phases_last_round": {k: {p: round(x, 4) for p, x in v.items()} for k, v in phases.items()},
                "nftables_phases_last_round": {
                    k: {p: round(x, 4) for p, x in v.items()} for k, v in nft_phases.items()
                },
                "seconds": {k: [round(x, 4) for x in v] for k, v in t.items() if v},
            }
            peer = "iptables-legacy-restore"
            for what, key in (("full apply", "full"), ("no-op re-apply", "noop"), ("one rule changed", "change")):
                g = GOALS.get(f"{key}_{n}")
                sec.rows.append(
                    row(
                        f"{what}, {n} rules ({kernel_rules} kernel rules), --backend restore",
                        m[f"nl_{key}"],
                        m[f"peer_{key}"],
                        unit="s",
                        better="lower",
                        peer_name=peer + (" (whole file again)" if key != "full" else ""),
                        goal=f"<= {g} s" if g else "",
                        met=(m[f"nl_{key}"] <= g) if g else None,
                    )
                )
            if with_nft:
                for what, key in (("full apply", "full"), ("no-op re-apply", "noop"), ("one rule changed", "change")):
                    if key == "full":
                        g = m["nl_full"]
                        goal, met = f"<= --backend restore's full ({g:.3f} s)", m["nft_full"] <= g
                    else:
                        gg = NFT_GOALS.get(f"{key}_{n}")
                        goal, met = (f"<= {gg} s", m[f"nft_{key}"] <= gg) if gg else ("", None)
                    sec.rows.append(
                        row(
                            f"{what}, {n} rules ({nft_rules} nft rules), --backend nftables",
                            m[f"nft_{key}"],
                            m[f"nftpeer_{key}"],
                            unit="s",
                            better="lower",
                            peer_name="nft -f" + (" (whole table again, one transaction)" if key != "full" else ""),
                            goal=goal,
                            met=met,
                            vs_restore=round(m[f"nl_{key}"], 4),
                            note=f"--backend restore: {m[f'nl_{key}']:.3f} s",
                        )
                    )
            if t["pyipt_full"]:
                for what, key in (("full apply", "full"), ("no-op re-apply", "noop"), ("one rule changed", "change")):
                    sec.rows.append(
                        row(
                            f"{what}, {n} rules, --backend python-iptables (1 round)",
                            m[f"pyipt_{key}"],
                            m[f"peer_{key}"],
                            unit="s",
                            better="lower",
                            peer_name=peer + (" (whole file again)" if key != "full" else ""),
                            note="the fallback backend, for comparison",
                        )
                    )
        sec.details["backends"] = ["restore", "nftables", "python-iptables"]
        sec.details["curve"] = curve
    finally:
        for ns in (ns_nl, ns_peer, ns_nft, ns_nftpeer):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
    return sec
