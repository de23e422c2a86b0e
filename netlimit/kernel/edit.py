"""The smallest edit between two sequences of keys: which live items go, which wanted
ones come in, everything else stays where it is. Pure. Both packet-filter planners
use it (xtables/plan.py over canonical rule specs, nft/backend.py over rule
fingerprints), so untouched rules keep their counters and state."""

from __future__ import annotations

import difflib
from collections.abc import Hashable, Sequence


def edit(live: Sequence[Hashable], want: Sequence[Hashable]) -> tuple[list[int], list[int]]:
    """(indexes of `live` to delete, indexes of `want` to insert), both ascending; the
    rest of `live` equals the rest of `want`, in order. The common head and tail are
    cut first, so difflib only sees the part that changed (one change in 2,000 rules
    compares a handful)."""
    head = 0
    while head < len(live) and head < len(want) and live[head] == want[head]:
        head += 1
    tail = 0
    while tail < len(live) - head and tail < len(want) - head and live[-1 - tail] == want[-1 - tail]:
        tail += 1
    dels: list[int] = []
    ins: list[int] = []
    sm = difflib.SequenceMatcher(None, live[head : len(live) - tail], want[head : len(want) - tail], autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag != "equal":
            dels.extend(range(head + i1, head + i2))
            ins.extend(range(head + j1, head + j2))
    return dels, ins
