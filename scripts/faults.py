#!/usr/bin/env python3
"""Fault drills for the kernel layer (issue 24), each in a network namespace of its own.

    .venv/bin/python scripts/faults.py kill9 --rounds 50            # kill -9 during an apply
    .venv/bin/python scripts/faults.py concurrent --rounds 100      # writers racing each other
    .venv/bin/python scripts/faults.py stop --rounds 50 --busy      # SIGTERM mid-reload, cores busy
    ... --backend nftables|restore|python-iptables (repeatable; default: nftables and
    restore), --json for the figures

kill9: a 1,000-rule file A is in the kernel; `netlimit apply B` (500 rules removed,
    500 added) is killed with SIGKILL at a random moment of its run (the next round
    goes back, B to A, from where this one converged). Afterwards each
    family (legacy) or the table (nftables) must hold exactly A's rules or exactly B's,
    never a mix, never a duplicate; one `netlimit apply B` must converge and the next
    must change nothing; that apply reports how many owned objects it found (adopted).
concurrent: per round, two `netlimit apply` of different files, a running daemon's
    resync (SIGHUP), and another tool appending/deleting its own rules (iptables-legacy
    -A/-D in a chain of its own, nft add/delete in a table of its own), all at once.
    Afterwards: no foreign rule lost or duplicated, netlimit's rules exactly one of the
    files (writers are serialised: the last one's) and, once the daemon's resync has run,
    exactly the daemon's file (the last writer), every failed command names a lock.
stop: per round a daemon starts, its file is edited and it is sent SIGHUP (a reload
    in flight) while it resyncs every 0.2 s, then SIGTERM: zero owned objects must
    remain, and its log must say what it removed, counted from the kernel.

Only namespaces this script creates are touched (names nlf-<pid>-...); every loop is
bounded; teardown is in `finally`. Exit 1 when a promise is broken.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import fcntl
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXE = str(Path(sys.executable).with_name("netlimit"))
BACKENDS = ("nftables", "restore", "python-iptables")
DEFAULT_BACKENDS = ("nftables", "restore")  # what auto picks on an nf_tables host and on a legacy one


def sh(*cmd: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=check)


@contextlib.contextmanager
def netns(tag: str):
    name = f"nlf-{os.getpid() % 100000}-{tag}"[:30]
    sh("ip", "netns", "add", name)
    try:
        sh("ip", "-n", name, "link", "set", "lo", "up")
        yield name
    finally:
        sh("ip", "netns", "del", name, check=False)


@contextlib.contextmanager
def busy_cores(on: bool, n: int = 2):
    """`n` processes spinning (a CPU stress), killed on the way out."""
    procs = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(n if on else 0)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


def rules_file(names: range, port0: int = 20000) -> str:
    out = ["version: 1", "network:"]
    for i in names:
        out += [
            f"  - name: r{i}",
            "    protocol: udp",
            f"    ports: [{port0 + i}]",
            "    limit: 100/second",
            "    burst: 10",
        ]
    return "\n".join(out) + "\n"


def owned(ns: str, backend: str) -> dict[str, list[str]]:
    """netlimit's objects in the kernel, per family (legacy) or for the table (nftables),
    in kernel order, counters left out."""
    ex = ("ip", "netns", "exec", ns)
    if backend == "nftables":
        p = sh(*ex, "nft", "list", "table", "inet", "netlimit", check=False)
        lines = [re.sub(r"counter packets \d+ bytes \d+", "counter", ln.strip()) for ln in p.stdout.splitlines()]
        # sets by name (their listing order is creation order, which history decides), and
        # each chain's rules in order (that order matters); a set's body lines are left out
        out: dict[str, list[str]] = {"inet sets": []}
        chain = ""
        for ln in lines:
            if ln.startswith("set "):
                out["inet sets"].append(ln)
            elif ln.startswith("chain "):
                chain = ln
                out[f"inet {ln}"] = []
            elif 'comment "netlimit' in ln and chain:
                out[f"inet {chain}"].append(ln)
        out["inet sets"].sort()
        return out if p.returncode == 0 else {}
    out: dict[str, list[str]] = {}
    for fam, tool in ((4, "iptables-legacy-save"), (6, "ip6tables-legacy-save")):
        text = sh(*ex, tool, "-t", "filter", check=False).stdout
        out[f"IPv{fam}"] = [ln for ln in text.splitlines() if "netlimit" in ln.lower() and ln.startswith(("-A", ":"))]
    return out


def owned_quiet(ns: str, backend: str) -> dict[str, list[str]]:
    """owned(), read while holding netlimit's writer lock of the namespace (a flock on
    /run/netns/NS): no netlimit writer (the daemon's resync included) is mid-write."""
    fd = os.open(f"/run/netns/{ns}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return owned(ns, backend)
    finally:
        os.close(fd)


def apply(ns: str, backend: str, path: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return sh(EXE, "apply", str(path), "--netns", ns, "--backend", backend, "-q", check=False, timeout=timeout)


def _distance(a: dict[str, list[str]], b: dict[str, list[str]]) -> int:
    """How many objects differ between two states (as multisets)."""
    ca = collections.Counter(x for lst in a.values() for x in lst)
    cb = collections.Counter(x for lst in b.values() for x in lst)
    return sum(((ca - cb) + (cb - ca)).values())


def dupes(state: dict[str, list[str]]) -> list[str]:
    return [f"{k}: {ln}" for k, lst in state.items() for ln, n in collections.Counter(lst).items() if n > 1]


# --- kill -9 during apply -----------------------------------------------------------------


def drill_kill9(backend: str, rounds: int, tmp: Path, busy: bool) -> dict:
    a, b = tmp / f"a-{backend}.yaml", tmp / f"b-{backend}.yaml"
    a.write_text(rules_file(range(0, 1000)))
    b.write_text(rules_file(range(500, 1500)))
    res = {"backend": backend, "rounds": 0, "old": 0, "new": 0, "mixed": 0, "duplicates": 0, "not_converged": 0}
    problems: list[str] = []
    with netns(f"k9{backend[:3]}") as ns, busy_cores(busy):
        p = apply(ns, backend, a)
        if p.returncode:
            raise SystemExit(f"apply {a.name}: {p.stderr}")
        t0 = time.monotonic()
        p = apply(ns, backend, b)  # the transition the kills interrupt, timed
        full = time.monotonic() - t0
        if p.returncode:
            raise SystemExit(f"apply {b.name}: {p.stderr}")
        res["apply_seconds"] = round(full, 3)
        want = {b: owned(ns, backend)}
        apply(ns, backend, a)
        want[a] = owned(ns, backend)
        # the rounds alternate the direction (A -> B, then B -> A: 500 rules removed and
        # 500 added either way), so each round starts where the last converged
        old, new = a, b
        for rnd in range(rounds):
            if owned(ns, backend) != want[old]:
                p = apply(ns, backend, old)
                if p.returncode:
                    problems.append(f"round {rnd}: re-applying {old.name} failed: {p.stderr.strip()}")
                    break
            # half the kills anywhere in the run, half in its last 40 % (where the kernel
            # is read and written; before that the process is still starting)
            at = random.uniform(0.0, full * 1.1) if rnd % 2 else random.uniform(full * 0.6, full * 1.05)
            proc = subprocess.Popen(
                [EXE, "apply", str(new), "--netns", ns, "--backend", backend, "-q"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                proc.wait(timeout=at)
            except subprocess.TimeoutExpired:
                proc.kill()
            proc.wait(timeout=60)
            # an orphaned writer (iptables-legacy-restore, or nft -f: a commit landing between
            # the dumps of one `nft list` reads as a mix) may still be committing its input:
            # wait until no process is left in the namespace (this one, not any on the host)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and (
                orphans := sh("ip", "netns", "pids", ns, check=False).stdout.split()
            ):
                time.sleep(0.05)
            if orphans:
                problems.append(f"round {rnd}: processes still in the namespace 30 s after the kill: {orphans}")
            got = owned(ns, backend)
            res["rounds"] += 1
            d = dupes(got)
            if d:
                res["duplicates"] += 1
                problems.append(f"round {rnd} (kill at {at:.2f} s): duplicates: {d[:3]}")
            # the unit of atomicity: each family of the legacy tables, the whole nftables table
            units = [("inet", list(got))] if backend == "nftables" else [(k, [k]) for k in got]
            for unit, keys in units:
                g = {k: got.get(k) for k in keys}
                if g == {k: want[old].get(k) for k in keys}:
                    res["old"] += 1
                elif g == {k: want[new].get(k) for k in keys}:
                    res["new"] += 1
                else:
                    res["mixed"] += 1
                    n = sum(len(v or []) for v in g.values())
                    problems.append(f"round {rnd} (kill at {at:.2f} s): {unit} is a mix ({n} objects)")
            p1 = apply(ns, backend, new)
            p2 = sh(EXE, "plan", str(new), "--netns", ns, "--backend", backend, check=False)
            if p1.returncode or owned(ns, backend) != want[new] or "no changes" not in p2.stdout.lower():
                res["not_converged"] += 1
                problems.append(f"round {rnd}: did not converge in one apply: {p1.stderr.strip()[:300]}")
            # the converging apply says what it found in place (adopted)
            m = re.search(
                r"adopting (\d+) owned objects found in the kernel|already matches .* \((\d+) owned", p1.stdout
            )
            if not m or not int(m.group(1) or m.group(2)):
                problems.append(
                    f"round {rnd}: the converging apply does not report what it adopted: {p1.stdout!r:.300}"
                )
            else:
                res.setdefault("adopted", []).append(int(m.group(1) or m.group(2)))
            old, new = new, old
    res["problems"] = problems
    return res


# --- concurrent writers -------------------------------------------------------------------


FOREIGN_NFT = "table inet foreign {\n chain input {\n  type filter hook input priority 10;\n }\n}\n"


def foreign_rules(ns: str) -> dict[str, list[str]]:
    ex = ("ip", "netns", "exec", ns)
    ipt = [ln for ln in sh(*ex, "iptables-legacy-save", "-t", "filter").stdout.splitlines() if "foreign-" in ln]
    nft = [
        ln.strip() for ln in sh(*ex, "nft", "list", "table", "inet", "foreign").stdout.splitlines() if "foreign-" in ln
    ]
    return {"iptables": ipt, "nft": nft}


def foreign_tool(ns: str, rnd: int) -> list[str]:
    """Append three rules to each foreign place and delete the first of them: +2 each."""
    ex = ("ip", "netns", "exec", ns)
    errs = []
    for k in range(3):
        c = f"foreign-{rnd}-{k}"
        p = sh(*ex, "iptables-legacy", "-w", "-A", "FOREIGN", "-p", "tcp", "--dport", "9", "-m", "comment",
               "--comment", c, "-j", "ACCEPT", check=False)  # fmt: skip
        if p.returncode:
            errs.append(f"iptables -A: {p.stderr.strip()}")
        p = sh(*ex, "nft", "add", "rule", "inet", "foreign", "input", "tcp", "dport", "9", "accept", "comment",
               f'"{c}"', check=False)  # fmt: skip
        if p.returncode:
            errs.append(f"nft add: {p.stderr.strip()}")
    c = f"foreign-{rnd}-0"
    p = sh(*ex, "iptables-legacy", "-w", "-D", "FOREIGN", "-p", "tcp", "--dport", "9", "-m", "comment",
           "--comment", c, "-j", "ACCEPT", check=False)  # fmt: skip
    if p.returncode:
        errs.append(f"iptables -D: {p.stderr.strip()}")
    listing = sh(*ex, "nft", "-a", "list", "chain", "inet", "foreign", "input").stdout
    m = re.search(rf'comment "{c}" # handle (\d+)', listing)
    if m:
        p = sh(*ex, "nft", "delete", "rule", "inet", "foreign", "input", "handle", m.group(1), check=False)
        if p.returncode:
            errs.append(f"nft delete: {p.stderr.strip()}")
    else:
        errs.append(f"nft: {c} not found to delete")
    return errs


def drill_concurrent(backend: str, rounds: int, tmp: Path, busy: bool) -> dict:
    files = {
        "A": tmp / f"ca-{backend}.yaml",
        "B": tmp / f"cb-{backend}.yaml",
        "D": tmp / f"cd-{backend}.yaml",
    }
    files["A"].write_text(rules_file(range(0, 40)))
    files["B"].write_text(rules_file(range(20, 70)))
    files["D"].write_text(rules_file(range(10, 30)))
    res = {"backend": backend, "rounds": 0, "ended_as": collections.Counter(), "lock_waits_named": 0}
    problems: list[str] = []
    with netns(f"cw{backend[:3]}") as ns, busy_cores(busy):
        ex = ("ip", "netns", "exec", ns)
        wants = {}
        for k, f in files.items():
            apply(ns, backend, f)
            wants[k] = owned(ns, backend)
        sh(*ex, "iptables-legacy", "-N", "FOREIGN")
        sh(*ex, "iptables-legacy", "-A", "INPUT", "-j", "FOREIGN")
        subprocess.run([*ex, "nft", "-f", "-"], input=FOREIGN_NFT, text=True, check=True, timeout=30)
        log = tmp / f"daemon-{backend}.log"
        env = dict(os.environ, NETLIMIT_BACKEND=backend)
        daemon = subprocess.Popen(
            [EXE, "daemon", "--config", str(files["D"]), "--netns", ns, "--resync", "0.2",
             "--socket", str(tmp / f"d-{backend}.sock")],
            stdout=subprocess.DEVNULL, stderr=open(log, "w"), env=env,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60  # ready: its signal handlers are in place
            while time.monotonic() < deadline and "running:" not in log.read_text() and daemon.poll() is None:
                time.sleep(0.05)
            expected_foreign = 0
            for rnd in range(rounds):
                procs = [
                    subprocess.Popen([EXE, "apply", str(files[k]), "--netns", ns, "--backend", backend, "-q"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                    for k in ("A", "B")
                ]  # fmt: skip
                daemon.send_signal(signal.SIGHUP)
                errs = foreign_tool(ns, rnd)
                expected_foreign += 2
                outs = [p.communicate(timeout=300) for p in procs]
                for p, (_o, e) in zip(procs, outs, strict=True):
                    if p.returncode:
                        if re.search(r"/run/(xtables\.lock|netns/|netlimit/)", e):  # the lock, by its path
                            res["lock_waits_named"] += 1
                        else:
                            problems.append(f"round {rnd}: apply failed without naming a lock: {e.strip()[:300]}")
                problems += [f"round {rnd}: foreign tool: {e}" for e in errs]
                got = owned_quiet(ns, backend)
                ended = [k for k, w in wants.items() if w == got]
                d = dupes(got)
                if d:
                    problems.append(f"round {rnd}: duplicates: {d[:3]}")
                if not ended:
                    n = sum(map(len, got.values()))
                    k, w = min(wants.items(), key=lambda kw: _distance(kw[1], got))
                    want_all = [x for lst in w.values() for x in lst]
                    got_all = [x for lst in got.values() for x in lst]
                    extra = [x for x in got_all if x not in want_all]
                    missing = [x for x in want_all if x not in got_all]
                    problems.append(
                        f"round {rnd}: netlimit's rules are none of the files ({n} objects); closest {k}: "
                        f"{len(extra)} extra {extra[:3]}, {len(missing)} missing {missing[:3]}"
                    )
                res["ended_as"][ended[0] if ended else "mix"] += 1
                # the daemon repairs drift every 0.2 s: the last writer is its file, D
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and owned_quiet(ns, backend) != wants["D"]:
                    time.sleep(0.1)
                if owned_quiet(ns, backend) != wants["D"]:
                    problems.append(f"round {rnd}: netlimit did not end equal to the daemon's file D (its resync)")
                fr = foreign_rules(ns)
                for k, lst in fr.items():
                    if len(lst) != expected_foreign or len(set(lst)) != len(lst):
                        problems.append(f"round {rnd}: {k}: {len(lst)} foreign rules, expected {expected_foreign}")
                res["rounds"] += 1
                if daemon.poll() is not None:
                    problems.append(f"round {rnd}: the daemon exited ({daemon.returncode})")
                    break
                if len(problems) > 20:
                    break
        finally:
            if daemon.poll() is None:
                daemon.send_signal(signal.SIGTERM)
                try:
                    daemon.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    daemon.kill()
        left = owned(ns, backend)
        if any(left.values()):
            problems.append(f"after the daemon's stop {sum(map(len, left.values()))} owned objects remain")
    res["ended_as"] = dict(res["ended_as"])
    res["problems"] = problems
    return res


# --- SIGTERM while a reload and a resync are in flight --------------------------------------


def drill_stop(backend: str, rounds: int, tmp: Path, busy: bool) -> dict:
    a = tmp / f"sa-{backend}.yaml"
    a.write_text(rules_file(range(0, 200)))
    b_text = rules_file(range(100, 300))
    res = {"backend": backend, "rounds": 0, "left_objects": 0, "unlogged": 0, "stop_seconds": []}
    problems: list[str] = []
    with netns(f"st{backend[:3]}") as ns, busy_cores(busy):
        env = dict(os.environ, NETLIMIT_BACKEND=backend)
        for rnd in range(rounds):
            cfg = tmp / f"stop-{backend}.yaml"
            cfg.write_text(a.read_text())
            log = tmp / f"stop-{backend}-{rnd}.log"
            sock = tmp / f"stop-{backend}.sock"
            d = subprocess.Popen(
                [EXE, "daemon", "--config", str(cfg), "--netns", ns, "--resync", "0.2", "--socket", str(sock)],
                stdout=subprocess.DEVNULL, stderr=open(log, "w"), env=env,
            )  # fmt: skip
            try:
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline and "running:" not in log.read_text() and d.poll() is None:
                    time.sleep(0.05)
                new = cfg.with_suffix(".new")
                new.write_text(b_text if rnd % 2 == 0 else a.read_text() + "\n# edited\n")
                os.replace(new, cfg)
                d.send_signal(signal.SIGHUP)
                time.sleep(random.uniform(0.0, 0.3))  # the moment of the stop, at random
                t0 = time.monotonic()
                d.send_signal(signal.SIGTERM)
                rc = d.wait(timeout=120)
                res["stop_seconds"].append(time.monotonic() - t0)
            finally:
                if d.poll() is None:
                    d.kill()
                    d.wait(timeout=10)
            left = owned(ns, backend)
            n_left = sum(len(v) for v in left.values())
            text = log.read_text()
            res["rounds"] += 1
            if rc != 0 or n_left:
                res["left_objects"] += n_left
                problems.append(f"round {rnd}: exit {rc}, {n_left} owned objects left; log tail: {text[-400:]}")
                sh(EXE, "flush", "--netns", ns, "--backend", backend, "-q", check=False)
            if not re.search(r"on_stop flush: (removed \d+ owned objects .*read back: none remain|nothing)", text):
                res["unlogged"] += 1
                problems.append(f"round {rnd}: the log does not say what the flush removed: {text[-400:]}")
    s = sorted(res["stop_seconds"])
    res["stop_seconds"] = {"p50": round(s[len(s) // 2], 3), "max": round(s[-1], 3)} if s else {}
    res["problems"] = problems
    return res


DRILLS = {"kill9": drill_kill9, "concurrent": drill_concurrent, "stop": drill_stop}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("drill", choices=sorted(DRILLS))
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--backend", choices=BACKENDS, action="append", help="default: nftables and restore")
    ap.add_argument("--busy", action="store_true", help="keep both cores busy meanwhile (a CPU stress)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # teardown runs on a kill too
    if os.geteuid() != 0:
        print("faults.py: needs root (network namespaces)", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    results = []
    with tempfile.TemporaryDirectory(prefix="nlfaults-") as tmp:
        for backend in args.backend or DEFAULT_BACKENDS:
            results.append(DRILLS[args.drill](backend, args.rounds, Path(tmp), args.busy))
    out = {"drill": args.drill, "busy": args.busy, "seconds": round(time.monotonic() - t0, 1), "results": results}
    failed = any(r.get("problems") for r in results)
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for r in results:
            probs = r.pop("problems")
            print(json.dumps(r))
            for p in probs[:20]:
                print("  PROBLEM:", p)
        print(f"{args.drill}: {out['seconds']} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
