"""iptables / ip6tables backend through iptables-legacy-save and iptables-legacy-restore.

The default backend when those programs are installed (reconcile.get_backend).
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
table replace). Only the differences are written: in owned chains the rules
that went are deleted by number and the new ones inserted at their place
(difflib over the canonical specs), so untouched rules keep their counters;
new chains are declared, dropped chains flushed and deleted; the jumps in
built-in chains are deleted by spec (other tools may have moved them) and
inserted at the top. Nothing to change: nothing is run.

hashlimit: the kernel keeps a hashlimit table's first settings while any rule
uses its name, so a rule whose hashlimit settings change is removed in a
first commit and the new one added in a second (as the python-iptables
backend does).

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

import difflib
import gc
import os
import re
import shutil
import subprocess
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

from .iptables import BUILTINS, TABLE, FamilyState, IptablesError, LiveRule, match_jumps
from .objects import COMMENT_PREFIX, IptChain, IptRule, owned_chain, owned_comment
from .render import rule_line, rule_spec
from .savefmt import canon, parse_spec

SAVE = {4: "iptables-legacy-save", 6: "ip6tables-legacy-save"}
RESTORE = {4: "iptables-legacy-restore", 6: "ip6tables-legacy-restore"}
TOOL = {4: "iptables", 6: "ip6tables"}
LOCK_WAIT_S = 10
TIMEOUT_S = 120


def binaries_missing(families=(4, 6)) -> list[str]:
    return [b for f in families for b in (SAVE[f], RESTORE[f]) if not shutil.which(b)]


@contextmanager
def _no_gc():
    """Thousands of small objects at once: without this the cyclic collector runs
    many full passes over the process's heap meanwhile (half the read time at 10,000 rules)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["LC_ALL"] = "C"
    return env


def _run(cmd: list[str], input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=TIMEOUT_S, env=_env())


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


# --- planning -----------------------------------------------------------------------------


@dataclass(slots=True)
class Want:
    """One rule as it should be: the text to write, the rule it belongs to (for
    messages), its canonical spec `kspec` (compared; computed when first needed: a
    full apply into an empty chain compares nothing) and what plan output shows."""

    chain: str
    text: str
    name: str
    family: int = 4
    source: IptRule | None = None  # for `line` (its position: -I at the top)
    counters: tuple[int, int] | None = None  # written with --counters (rollback)
    known: str | None = None  # the canonical spec, when already known

    @property
    def kspec(self) -> str:
        if self.known is None:
            self.known = canon(self.text, self.family)
        return self.known

    @property
    def line(self) -> str:
        """As render.rule_line spells it."""
        if self.source is not None and self.source.position == 0:
            return f"-I {self.chain} 1 {self.text}"
        return f"-A {self.chain} {self.text}"


@dataclass
class RestorePlan:
    family: int
    create_chains: list[str] = field(default_factory=list)
    # chain -> (live indexes to delete, [(final index, rule)] to insert, ascending)
    chain_ops: dict[str, tuple[list[int], list[tuple[int, Want]]]] = field(default_factory=dict)
    delete_chains: list[str] = field(default_factory=list)
    delete_jumps: list[LiveRule] = field(default_factory=list)
    add_jumps: list[tuple[int, Want]] = field(default_factory=list)  # (index in its chain, rule)
    pre_remove: dict[str, list[int]] = field(default_factory=dict)  # chain -> live indexes, commit 1
    changes: list[tuple[str, str, str, str]] = field(default_factory=list)
    live_len: dict[str, int] = field(default_factory=dict)  # chain -> rules at read time
    builtin_counts: dict[str, int] = field(default_factory=dict)
    wanted_chains: list[str] = field(default_factory=list)
    live_rules: dict[str, list[LiveRule]] = field(default_factory=dict)  # chain -> its rules at read time

    def live_name(self, chain: str, index: int) -> str | None:
        lst = self.live_rules.get(chain, [])
        return (_label(lst[index].rule) or None) if index < len(lst) else None

    @property
    def empty(self) -> bool:
        return not (self.create_chains or self.chain_ops or self.delete_chains or self.delete_jumps or self.add_jumps)


def _label(r: IptRule) -> str:
    return r.rule or r.comment


def want_of(r: IptRule, live_texts: set[str] | frozenset[str] = frozenset()) -> Want:
    """A desired rule with its canonical spec; a text -save printed as is is canonical
    already, so most rules of a no-op apply need no canon() at all."""
    text = rule_spec(r)
    return Want(r.chain, text, _label(r), r.family, r, None, text if text in live_texts else None)


def want_of_live(lr: LiveRule) -> Want:
    return Want(lr.rule.chain, lr.text, _label(lr.rule), lr.rule.family, None, (lr.packets, lr.bytes), lr.kspec)


_HL_SEG = re.compile(r"-m hashlimit (.*?)(?= -m | -j | -g |$)")
_HL_NAME = re.compile(r"--hashlimit-name (\S+)")


def _hashlimit_settings(kspec: str) -> dict[str, str]:
    """{table name: that match's whole canonical option text} of a rule's hashlimit matches."""
    if "-m hashlimit" not in kspec:
        return {}
    out = {}
    for seg in _HL_SEG.findall(kspec):
        m = _HL_NAME.search(seg)
        if m:
            out[m.group(1)] = seg
    return out


def _settings_change(kspec: str, want_hl) -> bool:
    """True if a going rule's hashlimit table is wanted with other settings: the kernel
    would keep this rule's settings for the new rule, so it must go in a first commit."""
    if "-m hashlimit" not in kspec:
        return False
    wanted = want_hl()
    return any(name in wanted and wanted[name] != {seg} for name, seg in _hashlimit_settings(kspec).items())


def plan_family(
    family: int, chains: list[str], want: dict[str, list[Want]], jumps: list[tuple[int, Want]], state: FamilyState
) -> RestorePlan:
    """The smallest edit that turns `state` into: `chains` holding `want[chain]` in order,
    and each of `jumps` ((index, rule) in a built-in chain) present once."""
    plan = RestorePlan(family, builtin_counts=dict(state.builtin_counts), wanted_chains=list(chains))
    hl_cache: list[dict[str, set[str]]] = []

    def want_hl() -> dict[str, set[str]]:  # hashlimit name -> settings the new rules give it
        if not hl_cache:
            names: dict[str, set[str]] = {}
            for c in chains:
                for w in want.get(c, []):
                    for name, seg in _hashlimit_settings(w.kspec).items():
                        names.setdefault(name, set()).add(seg)
            hl_cache.append(names)
        return hl_cache[0]

    for c in chains:
        if c not in state.chains:
            plan.create_chains.append(c)
            plan.changes.append(("+", c, "", f":{c} - [0:0]"))
        live = state.rules.get(c, [])
        wl = want.get(c, [])
        if not live:  # an empty or new chain: everything is appended, nothing to compare
            if wl:
                plan.chain_ops[c] = ([], list(enumerate(wl)))
                plan.live_len[c] = 0
                plan.changes.extend(("+", c, w.name, w.line) for w in wl)
            continue
        lk = [lr.kspec for lr in live]
        wk = [w.kspec for w in wl]
        if lk == wk:
            continue
        dels: list[int] = []
        ins: list[tuple[int, Want]] = []
        # common head and tail first: difflib then only sees the part that changed
        head = 0
        while head < len(lk) and head < len(wk) and lk[head] == wk[head]:
            head += 1
        tail = 0
        while tail < len(lk) - head and tail < len(wk) - head and lk[-1 - tail] == wk[-1 - tail]:
            tail += 1
        sm = difflib.SequenceMatcher(None, lk[head : len(lk) - tail], wk[head : len(wk) - tail], autojunk=False)
        for tag, i1, i2, j1, j2 in sm.get_opcodes():
            if tag != "equal":
                dels.extend(range(head + i1, head + i2))
                ins.extend((head + j, wl[head + j]) for j in range(j1, j2))
        plan.chain_ops[c] = (dels, ins)
        plan.live_len[c] = len(live)
        plan.live_rules[c] = live
        gone = Counter(lk[i] for i in dels)
        new = Counter(w.kspec for _, w in ins)
        want_set = set(wk)
        removed, added = gone - new, new - gone
        for i in dels:
            lr = live[i]
            if removed[lr.kspec] > 0:
                removed[lr.kspec] -= 1
                plan.changes.append(("-", c, _label(lr.rule), rule_line(lr.rule)))
                if lr.kspec not in want_set and _settings_change(lr.kspec, want_hl):
                    plan.pre_remove.setdefault(c, []).append(i)
        for _, w in ins:
            if added[w.kspec] > 0:
                added[w.kspec] -= 1
                plan.changes.append(("+", c, w.name, w.line))
        if gone & new:
            plan.changes.append(("~", c, "", f"reorder {len(wk)} rules of {c}"))
    for c in state.chains:
        if c not in chains:
            plan.delete_chains.append(c)
            for lr in state.rules.get(c, []):
                plan.changes.append(("-", c, _label(lr.rule), rule_line(lr.rule)))
            plan.changes.append(("-", c, "", f"delete chain {c}"))
    gone_jumps, new_jumps = match_jumps(state.jumps, {(w.chain, w.kspec): (idx, w) for idx, w in jumps})
    for bchain, lr in gone_jumps:
        plan.delete_jumps.append(lr)
        plan.changes.append(("-", bchain, "", rule_line(lr.rule)))
    for idx, w in new_jumps:
        plan.add_jumps.append((idx, w))
        plan.changes.append(("+", w.chain, "", w.line))
    return plan


# --- writing ------------------------------------------------------------------------------


@dataclass
class _Line:
    text: str
    rule: str | None  # the rule this line writes or removes (None: netlimit's own chains/jumps)
    want: Want | None = None


def _cmd(op: str, chain: str, rest: str, want: Want | None, counters: bool) -> str:
    pre = f"[{want.counters[0]}:{want.counters[1]}] " if counters and want is not None and want.counters else ""
    return f"{pre}{op} {chain} {rest}".rstrip()


def _commit_lines(plan: RestorePlan, counters: bool) -> list[_Line]:
    out: list[_Line] = []
    for c in plan.create_chains:
        out.append(_Line(f":{c} - [0:0]", None))
    for lr in plan.delete_jumps:
        out.append(_Line(f"-D {lr.rule.chain} {lr.text}", lr.rule.rule or None))
    for c, (dels, ins) in plan.chain_ops.items():
        pre = sorted(plan.pre_remove.get(c, []))
        left = plan.live_len.get(c, 0) - len(pre)
        for i in sorted(set(dels) - set(pre), reverse=True):
            shift = sum(1 for p in pre if p < i)
            out.append(_Line(f"-D {c} {i - shift + 1}", plan.live_name(c, i)))
            left -= 1
        for j, w in ins:
            if j >= left:
                out.append(_Line(_cmd("-A", c, w.text, w, counters), w.name, w))
            else:
                out.append(_Line(_cmd("-I", c, f"{j + 1} {w.text}", w, counters), w.name, w))
            left += 1
    for c in plan.delete_chains:
        out.append(_Line(f"-F {c}", None))
    for c in plan.delete_chains:
        out.append(_Line(f"-X {c}", None))
    lens = dict(plan.builtin_counts)
    for lr in plan.delete_jumps:
        lens[lr.rule.chain] = lens.get(lr.rule.chain, 1) - 1
    for idx, w in sorted(plan.add_jumps, key=lambda x: x[0]):
        n = lens.get(w.chain, 0)
        out.append(_Line(_cmd("-I", w.chain, f"{min(idx, n) + 1} {w.text}", w, counters), w.name or None, w))
        lens[w.chain] = n + 1
    return out


def _pre_remove_lines(plan: RestorePlan) -> list[_Line]:
    out = []
    for c, idxs in plan.pre_remove.items():
        for i in sorted(idxs, reverse=True):
            out.append(_Line(f"-D {c} {i + 1}", plan.live_name(c, i)))
    return out


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


class RestoreBackend:
    name = "iptables-legacy-restore (legacy x_tables)"
    key = "restore"

    def __init__(self) -> None:
        self._saved: dict[int, str] = {}
        self._running: dict[int, subprocess.Popen] = {}

    def prefetch(self, families) -> None:
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

    def available(self, family: int) -> str | None:
        missing = binaries_missing((family,))
        if missing:
            return f"{', '.join(missing)} not found on PATH (apt-get install iptables)"
        try:
            self._saved[family] = self._collect(family)  # read() uses this output right after
        except (IptablesError, OSError, subprocess.TimeoutExpired) as exc:
            return str(exc)
        return None

    def read(self, family: int) -> FamilyState:
        text = self._saved.pop(family, None)
        if text is None:
            text = save(family)
        with _no_gc():
            return parse_save(text, family)

    def plan(self, family: int, chains: list[IptChain], rules: list[IptRule], state: FamilyState) -> RestorePlan:
        names = [c.name for c in chains]
        nameset = set(names)
        want: dict[str, list[Want]] = {c: [] for c in names}
        jumps: list[tuple[int, Want]] = []
        live_texts = {lr.text for lst in state.rules.values() for lr in lst}
        live_texts.update(lr.text for lst in state.jumps.values() for lr in lst)
        with _no_gc():
            for r in rules:
                w = want_of(r, live_texts)
                if r.chain in nameset:
                    want[r.chain].append(w)
                else:
                    jumps.append((r.position or 0, w))
            return plan_family(family, names, want, jumps, state)

    def write(self, plan: RestorePlan) -> None:
        if plan.empty:
            return
        commits: list[tuple[str, list[_Line]]] = []
        if plan.pre_remove:  # a first commit, so that the kernel drops those hashlimit tables
            commits.append(("removing hashlimit rules whose settings changed", _pre_remove_lines(plan)))
        counters = any(w.counters for _, ins in plan.chain_ops.values() for _, w in ins) or any(
            w.counters for _, w in plan.add_jumps
        )
        commits.append(("the new rule set", _commit_lines(plan, counters)))
        _restore(plan.family, commits, plan.wanted_chains, counters)

    def restore(self, state: FamilyState) -> None:
        """Put back exactly the owned chains, rules (with their counters) and jumps of `state`."""
        cur = parse_save(save(state.family), state.family)
        want = {c: [want_of_live(lr) for lr in state.rules.get(c, [])] for c in state.chains}
        jumps = [(lr.index, want_of_live(lr)) for lst in state.jumps.values() for lr in lst]
        self.write(plan_family(state.family, list(state.chains), want, jumps, cur))
