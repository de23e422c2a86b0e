"""iptables / ip6tables backend through iptables-legacy-save and iptables-legacy-restore.

The default backend when those programs are installed (registry.get_backend).
Per family and apply it runs one `-save` (read) and one `-restore --noflush`
(write; two when a hashlimit rule's settings change, see below), instead of
one python-iptables call of 1-3 ms per rule.

Namespaces: the programs are started from the calling thread, which
netns.run_in_netns has moved into the target namespace with setns(2); a child
forked from that thread starts in the same namespace (no `ip netns exec`).

Read: `iptables-legacy-save -t filter -c`, parsed only where netlimit owns
something: its chains (NETLIMIT, NETLIMIT-*) whole, and in INPUT / FORWARD /
OUTPUT the rules tagged `netlimit:` or jumping to an owned chain. Every rule
is kept with the text -save printed, which is both what is written back (on
rollback) and its canonical spec: savefmt.canon predicts -save's spelling, so
a desired rule (render.rule_spec) is compared as canon(text) -- or as is, when
-save printed that very text. The IptRule of a live rule (for `list` and the
plan's lines) is parsed only when asked for.

Write: one restore input per family, applied atomically by the kernel (one
table replace): the steps of the shared planner (netlimit/kernel/xtables/plan.py)
as restore lines, so only the differences are written and untouched rules keep
their counters. A hashlimit settings change is two `*filter ... COMMIT` blocks
in the same run. Nothing to change: nothing is run.

Errors: restore says which input line failed; each line maps back to the rule
it writes. A refusal at COMMIT (the kernel's checkentry, e.g. REJECT
tcp-reset on a non-TCP rule) names no line: the new rules are then tried one
commit each in a private, empty network namespace (`unshare --net`, gone when
it exits) to find the one the kernel refuses; if that is not possible (no
privilege, or the refusal depends on the live state) the changed rules are
all named. Locking: restore takes the xtables lock itself (`-w`); callers hold
netlimit's writer lock.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

from ..gcpause import no_gc
from ..netns import proc_net, writer_lock_fds
from ..objects import COMMENT_PREFIX, IptRule, owned_chain, owned_comment
from ..savefmt import canon, parse_spec
from .backend import XtablesBackend
from .plan import (
    BUILTINS,
    TABLE,
    TOOL,
    FamilyPlan,
    FamilyState,
    IptablesError,
    LiveRule,
    Op,
    Want,
    commit_ops,
    pre_remove_ops,
    want_of,
)

SAVE = {4: "iptables-legacy-save", 6: "ip6tables-legacy-save"}
RESTORE = {4: "iptables-legacy-restore", 6: "ip6tables-legacy-restore"}
LOCK_WAIT_S = 10
TIMEOUT_S = 120


def binaries_missing(families=(4, 6)) -> list[str]:
    return [b for f in families for b in (SAVE[f], RESTORE[f]) if not shutil.which(b)]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["LC_ALL"] = "C"
    return env


def _run(cmd: list[str], input: str | None = None) -> subprocess.CompletedProcess:
    if input is None:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=_env())
    # The input goes through an unlinked file, whole before the child starts: if we are
    # killed (kill -9) while it runs, it still reads every block to its COMMIT, never a
    # truncated last block (a pipe would end where our write stopped); and it holds our
    # writer lock until it exits (writer_lock_fds), so the next writer waits for it.
    with tempfile.TemporaryFile("w+", encoding="utf-8") as fh:
        fh.write(input)
        fh.flush()
        fh.seek(0)
        return subprocess.run(
            cmd,
            stdin=fh,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env=_env(),
            pass_fds=writer_lock_fds(),
        )


# --- reading ------------------------------------------------------------------------------


def _name_of(comment: str) -> str:
    return (
        comment[len(COMMENT_PREFIX) :]
        if comment.startswith(COMMENT_PREFIX) and not comment.startswith(COMMENT_PREFIX + " ")
        else ""
    )


class SavedRule(LiveRule):
    """A LiveRule read from -save output; its IptRule is parsed from the text on first
    use (a no-op apply of 2,000 rules needs only the canonical specs)."""

    def __init__(self, family: int, chain: str, text: str, index: int, packets: int = 0, nbytes: int = 0):
        self.family = family
        self.chain = chain
        self.text = text
        self.kspec = text  # -save's spelling is canonical: canon(text) == text (tested for every kind)
        self.index = index
        self.packets = packets
        self.bytes = nbytes
        self._rule: IptRule | None = None

    # a lazy property where LiveRule has a plain field (mypy's override): parsed on first use
    @property
    def rule(self) -> IptRule:  # type: ignore[override]
        if self._rule is None:
            kw = parse_spec(self.text)
            self._rule = IptRule(family=self.family, table=TABLE, chain=self.chain, rule=_name_of(kw["comment"]), **kw)
        return self._rule


def _live(family: int, chain: str, spec: str, index: int, packets: int, nbytes: int) -> LiveRule:
    return SavedRule(family, chain, spec, index, packets, nbytes)


def _target(spec: str) -> str | None:
    m = re.search(r"(?:^| )-[jg] (\S+)", spec)
    return m.group(1) if m else None


def parse_save(text: str, family: int) -> FamilyState:
    """Owned chains, rules and jumps of the filter table in `iptables-save [-c]` output."""
    st = FamilyState(family)
    declared: list[str] = []
    rules: list[tuple[str, str, int, int]] = []  # chain, spec, packets, bytes
    in_filter = False
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        if line[0] == "*":
            in_filter = line == "*filter"
            continue
        if not in_filter:
            continue
        if line[0] == ":":
            declared.append(line[1:].split(" ", 1)[0])
            continue
        pk = by = 0
        if line[0] == "[":
            close = line.index("]")
            a, _, b = line[1:close].partition(":")
            pk, by = int(a), int(b)
            line = line[close + 1 :].lstrip()
        if line.startswith("-A "):
            _, chain, *rest = line.split(" ", 2)
            rules.append((chain, rest[0] if rest else "", pk, by))
    owned = [c for c in declared if owned_chain(c)]
    owned_set = set(owned)
    st.chains = owned
    for c in owned:
        st.rules[c] = []
    for b in BUILTINS:
        if b in declared:
            st.jumps[b] = []
            st.builtin_counts[b] = 0
    for chain, spec, pk, by in rules:
        if chain in owned_set:
            lst = st.rules[chain]
            lst.append(_live(family, chain, spec, len(lst), pk, by))
        elif chain in st.builtin_counts:
            idx = st.builtin_counts[chain]
            st.builtin_counts[chain] = idx + 1
            if "netlimit:" in spec or _target(spec) in owned_set:
                lr = _live(family, chain, spec, idx, pk, by)
                if owned_comment(lr.rule.comment) or lr.rule.target in owned_set:
                    st.jumps[chain].append(lr)
    return st


def _filter_loaded(family: int) -> bool:
    """Whether this namespace has a legacy filter table of `family` at all. Where none
    was ever made (a host on nftables), netlimit owns nothing there, and reading it
    with -save would make one."""
    path = proc_net("ip_tables_names" if family == 4 else "ip6_tables_names")
    try:
        with open(path) as fh:
            return "filter" in fh.read().split()
    except FileNotFoundError:  # x_tables of this family never loaded: no legacy table exists
        return False
    except OSError as exc:  # unreadable: saying "nothing owned" could hide rules (a flush's read-back)
        raise IptablesError(f"cannot tell whether an IPv{family} legacy filter table exists ({path}: {exc})") from exc


def _save_cmd(family: int) -> list[str]:
    return [SAVE[family], "-t", TABLE, "-c"]


def _save_result(family: int, rc: int, out: str, err: str) -> str:
    if rc != 0:
        raise IptablesError(f"{SAVE[family]} failed: {(err or out).strip() or f'exit {rc}'}")
    return out


def save(family: int) -> str:
    """`iptables-legacy-save -t filter -c` in the calling thread's namespace."""
    p = _run(_save_cmd(family))
    return _save_result(family, p.returncode, p.stdout, p.stderr)


# --- writing ------------------------------------------------------------------------------


@dataclass
class _Line:
    text: str
    rule: str | None  # the rule this line writes or removes (None: netlimit's own chains/jumps)
    want: Want | None = None


def _lines(ops: list[Op], counters: bool) -> list[_Line]:
    return [_Line(op.text(counters), op.rule, op.want if op.kind in ("-I", "-A") else None) for op in ops]


_LINE_RE = re.compile(r"line:? (\d+)")


def _reason(stderr: str) -> str:
    keep = [
        ln.strip()
        for ln in stderr.splitlines()
        if ln.strip()
        and not ln.startswith("Try `")
        and not ln.startswith("Error occurred at line")
        and not re.search(r"restore: line \d+ failed", ln)
    ]
    return "; ".join(keep)


def _restore(
    family: int, commits: list[tuple[str, list[_Line]]], blame_chains: list[str], counters: bool = False
) -> None:
    """Feed the commits (what, lines) to one `*-restore --noflush` run, one `*filter ... COMMIT`
    block each (the kernel replaces the table once per block, in order); on failure
    IptablesError naming the rule. A failed block changes nothing; blocks before it stay."""
    tool = TOOL[family]
    where: dict[int, tuple[int, _Line | None]] = {}  # input line number -> (commit, line; None: COMMIT)
    parts: list[str] = []
    n = 0
    for k, (_what, lines) in enumerate(commits):
        parts.append("*filter\n")
        n += 1
        for ln in lines:
            n += 1
            where[n] = (k, ln)
            parts.append(ln.text + "\n")
        n += 1
        where[n] = (k, None)
        parts.append("COMMIT\n")
    cmd = [RESTORE[family], "--noflush", "-w", str(LOCK_WAIT_S)] + (["--counters"] if counters else [])
    whats = " and ".join(w for w, _ in commits)
    try:
        p = _run(cmd, "".join(parts))
    except subprocess.TimeoutExpired:
        raise IptablesError(f"{RESTORE[family]} did not finish within {TIMEOUT_S} s ({whats})") from None
    if p.returncode == 0:
        return
    err = (p.stderr or p.stdout).strip()
    if "xtables lock" in err:
        raise IptablesError(
            f"another program held the xtables lock (/run/xtables.lock) for {LOCK_WAIT_S} s "
            f"(an iptables command still running?); {tool}: {err}"
        )
    m = _LINE_RE.search(err)
    k, bad = where.get(int(m.group(1)) if m else -1, (len(commits) - 1, None))
    what = commits[k][0]
    reason = _reason(err)
    if bad is not None:
        shown = bad.text if len(bad.text) <= 300 else bad.text[:300] + "…"
        head = f"rule {bad.rule!r}: " if bad.rule else ""
        raise IptablesError(
            f"{head}{tool} refused `{shown}`" + (f": {reason}" if reason else "") + f" ({what})", bad.rule
        )
    # the kernel refused the table at COMMIT: find the rule by trying each new one alone
    new = [ln.want for ln in commits[k][1] if ln.want is not None]
    culprit = blame(family, new, blame_chains)
    if culprit is not None:
        raise IptablesError(
            f"rule {culprit.name!r}: the kernel refused `{culprit.line}` ({tool}, {what}); "
            "the kernel log (dmesg) says why",
            culprit.name,
        )
    names = list(dict.fromkeys(w.name for w in new if w.name))
    rule = ", ".join(names) or None
    raise IptablesError(
        f"the kernel refused {what} ({tool}: {err or 'exit ' + str(p.returncode)}); "
        f"rules written: {rule or '(none)'}; the kernel log (dmesg) says why",
        rule,
    )


def blame(family: int, wants: list[Want], chains: list[str]) -> Want | None:
    """The first of `wants` the kernel refuses on its own, tried one commit each in a
    private empty network namespace (None if none is refused, or it cannot be tried)."""
    if not wants or not shutil.which("unshare"):
        return None
    decl = "".join(f":{c} - [0:0]\n" for c in chains)
    blocks = []
    for w in wants:
        blocks.append(f"*filter\n{decl}-A {w.chain} {w.text}\nCOMMIT\n")
    per = 2 + decl.count("\n") + 1  # lines per block: *filter, decl..., -A, COMMIT
    try:
        p = subprocess.run(
            ["unshare", "--net", "--", RESTORE[family]],
            input="".join(blocks),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env=_env(),
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if p.returncode == 0:
        return None
    m = _LINE_RE.search(p.stderr or "")
    if not m:
        return None
    k = (int(m.group(1)) - 1) // per
    return wants[k] if 0 <= k < len(wants) else None


# --- the backend -----------------------------------------------------------------------------


class RestoreBackend(XtablesBackend):
    name = "iptables-legacy-restore (legacy x_tables)"
    key = "restore"

    def __init__(self) -> None:
        self._saved: dict[int, str] = {}
        self._running: dict[int, subprocess.Popen] = {}

    def _prefetch(self, families) -> None:
        """Start one -save per family at once (from this thread: in its namespace)."""
        for fam in families:
            if fam not in self._running and not binaries_missing((fam,)):
                try:
                    self._running[fam] = subprocess.Popen(
                        _save_cmd(fam), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env()
                    )
                except OSError:
                    pass

    def _collect(self, family: int) -> str:
        proc = self._running.pop(family, None)
        if proc is None:
            return save(family)
        try:
            out, err = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise IptablesError(f"{SAVE[family]} did not finish within {TIMEOUT_S} s") from None
        return _save_result(family, proc.returncode, out, err)

    def read(self):
        # A -save output is used once, right after it was taken: nothing read before a
        # write may stand for the kernel after it (this object may live across writes).
        self._saved.clear()
        self._prefetch([f for f in (4, 6) if _filter_loaded(f)])
        return super().read()

    def family_unavailable(self, family: int) -> str | None:
        missing = binaries_missing((family,))
        if missing:
            return f"{', '.join(missing)} not found on PATH (apt-get install iptables)"
        if not _filter_loaded(family):
            return None  # read_family: nothing there (and -save would create the table)
        try:
            self._saved[family] = self._collect(family)  # read_family() uses this output right after
        except (IptablesError, OSError, subprocess.TimeoutExpired) as exc:
            return str(exc)
        return None

    def available(self) -> str | None:
        missing = binaries_missing()
        return f"{', '.join(missing)} not found on PATH (apt-get install iptables)" if missing else None

    def read_family(self, family: int) -> FamilyState:
        if family not in self._saved and not _filter_loaded(family):
            return FamilyState(family)
        text = self._saved.pop(family, None)
        if text is None:
            text = save(family)
        with no_gc():
            return parse_save(text, family)

    def wants(self, family: int, state: FamilyState) -> Callable[[IptRule], Want]:
        """Desired rules compared as canon(text); a text -save printed as is is canonical
        already, so most rules of a no-op apply need no canon() at all."""
        live_texts = {lr.text for lst in state.rules.values() for lr in lst}
        live_texts.update(lr.text for lst in state.jumps.values() for lr in lst)

        def want(r: IptRule) -> Want:
            w = want_of(r, spell=canon)
            if w.text in live_texts:
                w.known = w.text
            return w

        return want

    def plan(self, desired, state):
        with no_gc():
            return super().plan(desired, state)

    def write_family(self, plan: FamilyPlan) -> None:
        if plan.empty:
            return
        self._saved.pop(plan.family, None)  # taken before this write: stale after it
        commits: list[tuple[str, list[_Line]]] = []
        if plan.pre_remove:  # a first commit, so that the kernel drops those hashlimit tables
            commits.append(("removing hashlimit rules whose settings changed", _lines(pre_remove_ops(plan), False)))
        counters = plan.counters
        commits.append(("the new rule set", _lines(commit_ops(plan), counters)))
        _restore(plan.family, commits, plan.wanted_chains, counters)
