"""nftables backend: the network rules as one table `inet netlimit` (nft/compile.py).

Talking to the kernel:

* write: `nft -f -` with a text script, one transaction per apply (nft sends the
  whole script as one netlink batch: the kernel takes all of it or nothing). Not
  python3-nftables: it is a Debian package, not on PyPI, so a virtualenv cannot
  depend on it, and it is a thin ctypes wrapper of libnftables, which is what the
  `nft` program is too. A text script is also exactly what `plan` prints and what
  an operator can paste, and nft's error names the failing line, which maps back
  to the rule.
* read: netlink.py, three netlink dumps (chains, sets, rules). `nft list` would
  also dump the elements of every set, one request per set: 0.28 s for a table of
  2,000 sets against a few ms here.

Ownership: netlimit owns the whole table and nothing outside it. Every rule and set
carries `netlimit:<rule> #<fingerprint>`; the plan compares fingerprints (it never
predicts how nft prints a rule back):

* a base chain (exempt rules, then one jump per rule in file order) is edited in
  place (edit.py): rules that stay keep their place and counter, the others are
  deleted by handle, new ones inserted before the next rule that stays;
* a rule's own chain (rule-<name>) stays as it is, or, when any of its rules
  changed, is flushed and filled again with appends: nft needs its whole rule
  cache for a positioned insert (0.07 s at 2,000 rules), not for an append, and
  the other rules' chains are not touched;
* a set whose fingerprint is wanted stays with its elements (the per-address state:
  a client being limited stays limited); a set whose meaning changed (rate, burst,
  key, timeout, size, exempt prefixes) is replaced, after the rules that use it;
* a no-op apply runs nothing.

Rollback: a failed `nft -f` changed nothing. To put an earlier state back (a later
step failed, or `apply --confirm` was not confirmed), the backend needs the text of
the rules it removed; the kernel only gives it back through `nft list`, so after every
write the backend records the table it wrote (/run/netlimit/nft-<netns inode>.json),
and the state read before a write carries that record.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import Any

from ...errors import NetlimitError
from ..edit import edit
from ..gcpause import no_gc
from ..netns import writer_lock_fds
from ..objects import (
    COMMENT_BANS,
    COMMENT_DENY,
    COMMENT_EXEMPT,
    COMMENT_PREFIX,
    NFT_BAN_HOST_SETS,
    NFT_BAN_SETS,
    NFT_DENY_SETS,
    NFT_FAMILY,
    NFT_INGRESS_CHAIN,
    NFT_RULE_CHAIN_PREFIX,
    NFT_TABLE,
    Desired,
    NftChain,
    NftRule,
    NftSet,
    NftTable,
    rule_of_comment,
)
from ..render import nft_set_body
from . import netlink as nfnetlink
from . import present

NFT = "nft"
TABLE = f"{NFT_FAMILY} {NFT_TABLE}"
TABLE_COMMENT = "netlimit: rate limits, managed by netlimit (netlimit list; netlimit flush removes it)"
TIMEOUT_S = 120
RECORD_DIR = "/run/netlimit"
RECORD_VERSION = 1


class NftError(NetlimitError):
    """nft refused the transaction (nothing was changed); `rule` names the netlimit rule if known."""

    def __init__(self, message: str, rule: str | None = None):
        super().__init__(message)
        self.rule = rule


# --- what was written, for rollback ---------------------------------------------------------


def _ns_inode() -> int:
    return os.stat("/proc/thread-self/ns/net").st_ino


def _record_path() -> str:
    return os.path.join(RECORD_DIR, f"nft-{_ns_inode()}.json")


class Record:
    """What netlimit wrote into the table, by comment: a rule by (chain, comment) (the
    exempt rules of `input` and `forward` are alike), a set by comment. Kept as the
    JSON rows it was read from; a row becomes an object only when asked for."""

    def __init__(self, rules: dict[tuple[str, str], list] | None = None, sets: dict[str, list] | None = None):
        self._rules = rules or {}
        self._sets = sets or {}

    def rule(self, chain: str, comment: str) -> NftRule | None:
        row = self._rules.get((chain, comment))
        if row is None:
            return None
        c, body, rule, cmt, family, sets, note = row
        return NftRule(c, body, rule, cmt, family, tuple(sets), note)

    def set(self, comment: str) -> NftSet | None:
        row = self._sets.get(comment)
        if row is None:
            return None
        name, spec, rule, cmt, elements = row
        return NftSet(name, spec, rule, cmt, tuple(elements))


def load_record(path: str) -> Record:
    """The record at `path` (empty if missing or unreadable)."""
    try:
        with open(path) as fh:
            data = json.loads(fh.read())
        if data.get("version") != RECORD_VERSION:
            return Record()
        return Record({(r[0], r[3]): r for r in data["rules"]}, {x[3]: x for x in data["sets"]})
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return Record()


def save_record(table: NftTable) -> None:
    """Record `table` as written (only rollback reads it; the kernel stays the truth)."""
    try:
        os.makedirs(RECORD_DIR, exist_ok=True)
        path = _record_path()
        if table.empty:
            forget_record()
            return
        _prune_records()
        doc = {
            "version": RECORD_VERSION,
            "rules": [[r.chain, r.body, r.rule, r.comment, r.family, r.sets, r.note] for r in table.rules],
            "sets": [[x.name, x.spec, x.rule, x.comment, x.elements] for x in table.sets],
        }
        tmp = path + ".tmp"
        with open(tmp, "w") as fh:
            fh.write(json.dumps(doc, separators=(",", ":")))
        os.replace(tmp, path)
    except OSError:
        pass


def keep_previous(path: str) -> str:
    """Move the record at `path` aside (a new one is about to be written); its new path."""
    prev = path + ".prev"
    try:
        os.replace(path, prev)
    except OSError:
        return ""
    return prev


def forget_record() -> None:
    try:
        os.unlink(_record_path())
    except OSError:
        pass


def prune_records() -> None:
    """Drop the records of namespaces that no longer exist (a flush calls it)."""
    try:
        _prune_records()
    except OSError:
        pass


def _prune_records() -> None:
    """Drop the records of namespaces that no longer exist."""
    live = set()
    for path in ["/proc/1/ns/net", "/proc/thread-self/ns/net"] + [
        os.path.join("/run/netns", n) for n in (os.listdir("/run/netns") if os.path.isdir("/run/netns") else [])
    ]:
        try:
            live.add(os.stat(path).st_ino)
        except OSError:
            pass
    for name in os.listdir(RECORD_DIR):
        m = re.fullmatch(r"nft-(\d+)\.json(?:\.prev)?", name)
        if m and int(m.group(1)) not in live:
            try:
                os.unlink(os.path.join(RECORD_DIR, name))
            except OSError:
                pass


# --- state and plan -----------------------------------------------------------------------


@dataclass
class NftState:
    table: nfnetlink.Table | None  # None: netlimit's table does not exist
    record: str = ""  # where the record of this namespace's table is (its path is per namespace)
    _known: Record | None = field(default=None, repr=False)

    @property
    def empty(self) -> bool:
        return self.table is None

    def count(self) -> int:
        t = self.table
        return 0 if t is None else 1 + len(t.chains) + len(t.sets) + sum(len(v) for v in t.rules.values())

    @property
    def known(self) -> Record:
        """What netlimit wrote, by comment."""
        return self.load_known()

    def load_known(self) -> Record:
        """Read the record once (a write replaces it, so a state read before a write
        must load it before)."""
        if self._known is None:
            self._known = load_record(self.record) if self.table is not None and self.record else Record()
        return self._known


@dataclass
class Step:
    text: str  # one nft command
    rule: str | None  # the netlimit rule it writes or removes (None: netlimit's own table, chains, exempt)


@dataclass
class NftPlan:
    table: NftTable  # what the table holds once written (recorded for rollback)
    before: NftState
    steps: list[Step] = field(default_factory=list)
    changes: list[tuple[str, str, str]] = field(default_factory=list)  # (op, rule, line)

    @property
    def empty(self) -> bool:
        return not self.steps

    def lines(self) -> list[str]:
        return [f"{op} {'nft':9} {line}" for op, _rule, line in self.changes]

    def script(self) -> str:
        return "".join(s.text + "\n" for s in self.steps)


def _same_chain(want: NftChain, live: nfnetlink.Chain) -> bool:
    if want.hook is None:
        return live.hook is None
    return (live.type, live.hook, live.priority, live.policy, live.devices) == (
        "filter",
        want.hook,
        want.priority,
        want.policy,
        tuple(sorted(want.devices)),
    )


def _chain_decl(c: NftChain) -> str:
    return f"chain {c.name} {{ {c.spec} }}" if c.spec else f"chain {c.name}"


def _shown(r: nfnetlink.Rule, state: NftState) -> str:
    """A live rule as `plan` shows it: its text as netlimit wrote it, else handle and comment."""
    k = state.known.rule(r.chain, r.comment)
    return k.text if k is not None else f'handle {r.handle} comment "{r.comment}"'


def _keeps(r: nfnetlink.Rule, wanted: dict[str, NftRule], doomed: set[str]) -> bool:
    """A live rule stays if it is wanted and uses no set about to be replaced (the kernel
    refuses that); the fingerprint says which sets it uses: the wanted rule's."""
    w = wanted.get(r.comment)
    return w is not None and not (doomed and doomed.intersection(w.sets))


def _anchors(live_handles: list[int], dels: list[int], ins: list[int], n_want: int) -> dict[int, int | None]:
    """For each inserted index of the wanted list: the handle of the next rule that stays
    (the new rule goes right before it), None when none follows (appended)."""
    gone = set(dels)
    stay = iter(h for i, h in enumerate(live_handles) if i not in gone)
    inserted = set(ins)
    handle_at = {j: next(stay) for j in range(n_want) if j not in inserted}
    anchor: dict[int, int | None] = {}
    nxt: int | None = None
    for j in range(n_want - 1, -1, -1):
        if j in inserted:
            anchor[j] = nxt
        else:
            nxt = handle_at[j]
    return anchor


def plan_table(want: NftTable, state: NftState) -> NftPlan:
    """The one transaction that turns `state` into `want` (see the module's notes)."""
    p = NftPlan(want, state)
    live = state.table

    def step(text: str, rule: str | None = None) -> None:
        p.steps.append(Step(text, rule or None))

    if want.empty:
        if live is not None:
            step(f"delete table {TABLE}")
            for chain, rules in live.rules.items():
                p.changes.extend(("-", rule_of_comment(r.comment), f"{chain}: {_shown(r, state)}") for r in rules)
            p.changes.extend(("-", "", f"set {n}") for n in live.sets)
            p.changes.append(("-", "", f"table {TABLE}"))
        return p
    if live is None:
        step(f'add table {TABLE} {{ comment "{TABLE_COMMENT}"; }}')
        p.changes.append(("+", "", f"table {TABLE}"))
        live = nfnetlink.Table()
    want_chains = {c.name: c for c in want.chains}
    remake = {n for n, c in want_chains.items() if n in live.chains and not _same_chain(c, live.chains[n])}
    gone_chains = [n for n in live.chains if n not in want_chains or n in remake]
    new_chains = [c for c in want.chains if c.name not in live.chains or c.name in remake]
    want_sets = {s.name: s for s in want.sets}
    doomed = {n for n, s in live.sets.items() if n not in want_sets or want_sets[n].comment != s.comment}
    by_chain: dict[str, list[NftRule]] = {c.name: [] for c in want.chains}
    for wr in want.rules:
        by_chain[wr.chain].append(wr)

    deletes: list[Step] = []  # rules out of base chains, by handle
    flushes: list[Step] = []  # rule chains rewritten whole
    appends: list[Step] = []  # the rules of rewritten and new rule chains
    inserts: list[Step] = []  # rules into base chains, at their place
    removed: list[tuple[str, tuple[str, str, str]]] = []  # base chains: (comment, change line)
    added: list[tuple[str, tuple[str, str, str]]] = []
    chain_removed: list[tuple[str, str, str]] = []  # rules' chains
    chain_added: list[tuple[str, str, str]] = []
    for c in want.chains:
        wrules = by_chain[c.name]
        lrules = [] if c.name in remake else live.rules.get(c.name, [])
        wanted = {r.comment: r for r in wrules}
        kept = [_keeps(r, wanted, doomed) for r in lrules]
        if c.hook is None:  # a rule's own chain: as it is, or rewritten whole (appends only)
            if [r.comment for r in lrules] == list(wanted) and all(kept):
                continue
            if lrules:
                flushes.append(Step(f"flush chain {TABLE} {c.name}", c.name[len(NFT_RULE_CHAIN_PREFIX) :]))
            # shown: what changes in meaning (a rule written again as it was is not a change)
            live_comments = {r.comment for r in lrules}
            for r in lrules:
                if r.comment not in wanted:
                    chain_removed.append(("-", rule_of_comment(r.comment), f"{c.name}: {_shown(r, state)}"))
            for w in wrules:
                appends.append(Step(f"add rule {TABLE} {c.name} {w.text}", w.rule))
                if w.comment not in live_comments:
                    chain_added.append(("+", w.rule, f"{c.name}: {w.text}"))
            continue
        # a base chain: the smallest edit over fingerprints, positions kept
        lkeys = [r.comment if k else f"\0{r.handle}" for r, k in zip(lrules, kept)]
        dels, ins = edit(lkeys, [r.comment for r in wrules])
        for i in dels:
            lr = lrules[i]
            deletes.append(Step(f"delete rule {TABLE} {c.name} handle {lr.handle}", rule_of_comment(lr.comment)))
            removed.append((lr.comment, ("-", rule_of_comment(lr.comment), f"{c.name}: {_shown(lr, state)}")))
        anchor = _anchors([r.handle for r in lrules], dels, ins, len(wrules))
        for j in ins:
            w = wrules[j]
            h = anchor[j]
            where = f"insert rule {TABLE} {c.name} position {h}" if h is not None else f"add rule {TABLE} {c.name}"
            inserts.append(Step(f"{where} {w.text}", w.rule))
            added.append((w.comment, ("+", w.rule, f"{c.name}: {w.text}")))

    p.changes.extend(("-", "", f"chain {n}") for n in gone_chains)
    p.changes.extend(("-", rule_of_comment(live.sets[n].comment), f"set {n}") for n in sorted(doomed))
    p.changes.extend(("+", "", _chain_decl(c)) for c in new_chains)
    new_sets = [s for s in want.sets if s.name not in live.sets or s.name in doomed]
    p.changes.extend(("+", s.rule, f"set {s.name} {nft_set_body(s)}") for s in new_sets)
    moved = {k for k, _ in removed} & {k for k, _ in added}  # deleted and added again: a move
    p.changes.extend(ch for k, ch in removed if k not in moved)
    p.changes.extend(chain_removed + chain_added)
    p.changes.extend(ch for k, ch in added if k not in moved)
    if moved:
        p.changes.append(("~", "", f"reorder {len(moved)} rules"))

    # the transaction: rules out, chains and sets out, chains and sets in, rules in
    p.steps.extend(deletes + flushes)
    for n in gone_chains:
        step(f"flush chain {TABLE} {n}")
        step(f"delete chain {TABLE} {n}")
    for n in sorted(doomed):
        step(f"delete set {TABLE} {n}", rule_of_comment(live.sets[n].comment) if live.sets[n].comment else None)
    for c in new_chains:
        step(f"add chain {TABLE} {c.name}" + (f" {{ {c.spec} }}" if c.spec else ""))
    for s in new_sets:
        step(f"add set {TABLE} {s.name} {nft_set_body(s)}", s.rule)
    p.steps.extend(appends + inserts)
    return p


# --- writing ---------------------------------------------------------------------------------

_WHERE = re.compile(r"^(?:/dev/stdin|-):(\d+):[\d-]+: Error: (.*)$", re.M)


def _run(script: str) -> subprocess.CompletedProcess:
    # The script goes through an unlinked file, whole before nft starts: if we are killed
    # (kill -9) while nft runs, it still reads every line (through a pipe it would read up
    # to where our write stopped, and a cut that still parses would commit part of the
    # plan). nft also holds our writer lock until it exits (writer_lock_fds).
    env = dict(os.environ, LC_ALL="C")
    with tempfile.TemporaryFile("w+", encoding="utf-8") as fh:
        fh.write(script)
        fh.flush()
        fh.seek(0)
        return subprocess.run(
            [NFT, "-f", "-"],
            stdin=fh,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env=env,
            pass_fds=writer_lock_fds(),
        )


def write_script(steps: list[Step]) -> None:
    """Run `steps` as one transaction; NftError naming the rule of the line nft refused."""
    script = "".join(s.text + "\n" for s in steps)
    try:
        p = _run(script)
    except FileNotFoundError:
        raise NftError(f"{NFT} is not installed (apt-get install nftables)") from None
    except subprocess.TimeoutExpired:
        raise NftError(f"nft -f did not finish within {TIMEOUT_S} s; nothing was changed") from None
    if p.returncode == 0:
        return
    err = (p.stderr or p.stdout).strip()
    m = _WHERE.search(err)
    if m and 1 <= int(m.group(1)) <= len(steps):
        bad = steps[int(m.group(1)) - 1]
        shown = bad.text if len(bad.text) <= 300 else bad.text[:300] + "…"
        head = f"rule {bad.rule!r}: " if bad.rule else ""
        raise NftError(f"{head}nft refused `{shown}`: {m.group(2).strip()}", bad.rule)
    names = list(dict.fromkeys(s.rule for s in steps if s.rule))
    raise NftError(f"nft refused the transaction: {err[:500] or 'exit ' + str(p.returncode)}", ", ".join(names) or None)


# --- the backend ---------------------------------------------------------------------------


class NftablesBackend:
    name = "nftables (table inet netlimit)"
    key = "nftables"
    count_bans = True  # rows(): count the ban list's interval sets (a dump of every element)
    layer = kind = "nftables"
    write_unit = "one nft transaction"
    tools = ("nft",)

    # --- what callers ask instead of comparing names (registry.FilterBackend) ---
    def ban_sets(self):
        from .bansets import NftBanSets

        return NftBanSets()

    def hot(self, rule_names: list[str]) -> list[dict[str, Any]]:
        return present.hot_entries()

    def plan_summary(self, desired: Desired) -> tuple[int, str]:
        return present.plan_summary(desired)

    def plan_sections(self, desired: Desired) -> list[str]:
        return present.plan_sections(desired)

    def plan_doc(self, desired: Desired) -> dict[str, Any]:
        return present.plan_doc(desired)

    def warnings(self, loaded: Any) -> list[Any]:
        return present.warnings(loaded)

    def note(self, netns: str | None) -> str | None:
        return None

    def prune_state(self) -> None:
        prune_records()

    def available(self) -> str | None:
        if not shutil.which(NFT):
            return f"{NFT} is not installed (apt-get install nftables)"
        return None

    def read(self) -> NftState:
        with no_gc():
            return NftState(nfnetlink.read_table(NFT_TABLE, NFT_FAMILY), _record_path())

    def plan(self, desired: Desired, state: NftState) -> NftPlan:
        with no_gc():
            return plan_table(desired.nft, state)

    def write(self, plan: NftPlan, record: NftTable | None = None) -> None:
        """Run the plan; then record the table written (`record`: the same without
        counter values, when a rollback wrote them). The record of what was there before
        stays beside it (.prev), where the state read before this write finds it."""
        if plan.empty:
            return
        write_script(plan.steps)
        before = plan.before
        if before._known is None and before.record:
            before.record = keep_previous(before.record)
        save_record(plan.table if record is None else record)

    def restore(self, state: NftState) -> None:
        """Put the table back as `state` held it: the rules and sets netlimit recorded
        writing, with the rules' counters; a replaced dynamic set comes back empty."""
        current = self.read()
        current._known = state.known  # what netlimit wrote before (the record on disk may be newer)
        if state.table is None:
            self.write(plan_table(NftTable(), current))
            return
        target, recorded, unknown = _table_of(state)
        if unknown:
            raise NftError(
                f"cannot put back {len(unknown)} object(s) of table {TABLE} whose text netlimit has no record "
                f"of ({', '.join(unknown[:5])}); nothing was changed"
            )
        self.write(plan_table(target, current), record=recorded)

    def rows(self, state: NftState) -> list[dict[str, Any]]:
        """One row per rule (not the jumps), with the size of the first dynamic set it
        uses (one netlink dump per set: `list` and `status` only)."""
        t = state.table
        if t is None:
            return []
        first_set = {}
        for rules in t.rules.values():
            for r in rules:
                dyn = [s for s in r.sets if s in t.sets and not s.startswith("exempt")]
                if dyn:
                    first_set[r.handle] = dyn[0]
        wanted = sorted(set(first_set.values()))
        ban_sets = [n for n in wanted if n in NFT_BAN_SETS.values() or n in NFT_BAN_HOST_SETS.values()]
        denied = [n for n in wanted if n in NFT_DENY_SETS.values()]  # static: counted always
        sizes = (
            nfnetlink.set_sizes(NFT_TABLE, [n for n in wanted if n not in ban_sets + denied], NFT_FAMILY)
            if wanted
            else {}
        )
        if self.count_bans:
            sizes.update(ban_set_sizes(ban_sets))
        sizes.update(ban_set_sizes(denied))
        rows: list[dict[str, Any]] = []
        for chain, rules in t.rules.items():
            base = chain in t.chains and t.chains[chain].hook is not None
            for r in rules:
                if (
                    base
                    and r.comment.startswith(COMMENT_PREFIX)
                    and not r.comment.startswith((COMMENT_EXEMPT, COMMENT_BANS, COMMENT_DENY))
                ):
                    continue  # a jump to a rule's chain: its rules have the counters
                row: dict[str, Any] = {
                    "rule": rule_of_comment(r.comment) if r.comment.startswith(COMMENT_PREFIX) else "(not netlimit's)",
                    # the ingress stage's rows say so: `list` shows `ingress+nftables`
                    "layer": "ingress" if chain == NFT_INGRESS_CHAIN else "nftables",
                    "object": f"{chain}: {_shown(r, state)}",
                    "chain": chain,
                    "packets": r.packets,
                    "bytes": r.bytes,
                    "dropped": r.packets if r.drops else 0,
                }
                if r.handle in first_set:
                    row["table"] = f"set {first_set[r.handle]}"
                    row["table_entries"] = sizes.get(first_set[r.handle])
                rows.append(row)
        return rows


def ban_set_sizes(names: list[str]) -> dict[str, int]:
    """Prefixes in each ban set (an interval is two elements: count its starts)."""
    from . import elements as nfelements

    out: dict[str, int] = {}
    for n in names:
        c = nfelements.count(NFT_TABLE, n, NFT_FAMILY)
        if c is not None:
            out[n] = c
    return out


def _table_of(state: NftState) -> tuple[NftTable, NftTable, list[str]]:
    """The NftTable `state` shows, from the record: with the rules' counters (to write)
    and without (to record), and what the record does not know."""
    t = state.table
    assert t is not None
    known = state.known
    unknown: list[str] = []
    chains = tuple(
        NftChain(c.name, c.hook, c.priority or 0, c.policy or "accept", c.devices) if c.hook else NftChain(c.name)
        for c in t.chains.values()
    )
    sets: list[NftSet] = []
    for s in t.sets.values():
        ks = known.set(s.comment)
        if ks is not None and ks.name == s.name:
            sets.append(ks)
        else:
            unknown.append(f"set {s.name}")
    rules: list[NftRule] = []
    counted: list[NftRule] = []
    for chain, lst in t.rules.items():
        for r in lst:
            k = known.rule(chain, r.comment)
            if k is not None:
                rules.append(k)
                body = re.sub(r"\bcounter\b", f"counter packets {r.packets} bytes {r.bytes}", k.body, count=1)
                counted.append(NftRule(k.chain, body, k.rule, k.comment, k.family, k.sets, k.note))
            else:
                unknown.append(f"{chain} rule handle {r.handle}")
    return NftTable(chains, tuple(sets), tuple(counted)), NftTable(chains, tuple(sets), tuple(rules)), unknown
