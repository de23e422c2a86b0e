"""The file watch and the reload policy netlimitd and the sidecar share."""

from __future__ import annotations

import os
import select
import time

from netlimit.reload import DropGuard
from netlimit.watch import FileWatch


def _woken(w: FileWatch, timeout: float = 1.0) -> bool:
    ready, _, _ = select.select([w], [], [], timeout)
    return bool(ready)


def test_a_write_wakes_only_when_it_is_closed(tmp_path):
    f = tmp_path / "n.yaml"
    f.write_text("version: 1\n")
    w = FileWatch(f)
    try:
        assert w.uses_inotify
        fh = open(f, "w")  # truncates: IN_MODIFY only
        fh.write("version: 1\nnetwork:\n")
        fh.flush()
        assert not _woken(w, 0.3)  # half-written: nothing to read yet
        fh.write("  []\n")
        fh.close()
        assert _woken(w) and w.changed()
        assert not w.changed()  # reported once
    finally:
        w.close()


def test_rename_over_and_chmod_wake(tmp_path):
    f = tmp_path / "n.yaml"
    f.write_text("a")
    w = FileWatch(f)
    try:
        new = tmp_path / "n.yaml.new"
        new.write_text("b")
        _woken(w, 0.2)
        w.changed()  # the .new file's own events: not our file
        os.replace(new, f)
        assert _woken(w) and w.changed()
        os.chmod(f, 0o000)  # e.g. after a reload failed with "Permission denied", the fix
        os.chmod(f, 0o644)
        assert _woken(w) and w.changed()
    finally:
        w.close()


def test_other_files_in_the_directory_do_not_count(tmp_path):
    f = tmp_path / "n.yaml"
    f.write_text("a")
    w = FileWatch(f)
    try:
        (tmp_path / "other").write_text("x")
        assert _woken(w) and not w.changed()
    finally:
        w.close()


def test_polling_reports_a_change_once_it_has_settled(tmp_path, monkeypatch):
    f = tmp_path / "n.yaml"
    f.write_text("a")
    w = FileWatch(f, settle=0.3)
    w.close()  # the polling fallback, as where inotify is unavailable
    f.write_text("ab")
    assert not w.changed()  # just moved: not yet
    deadline = time.monotonic() + 5
    while not w.changed():
        assert time.monotonic() < deadline, "the settled change was never reported"
        time.sleep(0.05)
    assert not w.changed()


def test_dropguard_holds_a_file_that_removes_most_rules():
    now = [100.0]
    g = DropGuard(settle=1.0, clock=lambda: now[0])
    five = ["a", "b", "c", "d", "e"]
    assert g.check("sha-a", ["a", "b", "c"], five) == 0  # 2 of 5 removed: at once
    assert g.check("sha-b", ["a", "b", "c", "x", "y", "z"], five) == 0  # renames of a minority: at once
    assert g.check("sha-empty", [], []) == 0  # nothing running: nothing to lose
    assert g.check("sha-most", ["a", "b"], five) == 1.0  # 3 of 5 removed: held
    assert g.holding
    assert g.removed(["a", "b"], five) == 3
    assert g.check("sha-renamed", ["v", "w", "x", "y", "z"], five) == 1.0  # every name new: held too
    now[0] += 0.4
    assert abs(g.check("sha-renamed", ["v", "w", "x", "y", "z"], five) - 0.6) < 1e-9  # not settled yet
    now[0] += 0.3
    assert g.check("sha-empty", [], five) == 1.0  # it changed again: the wait starts over
    now[0] += 1.0
    assert g.check("sha-empty", [], five) == 0  # stayed the same: accepted
    assert not g.holding
    # exactly half is not "most": a two-rule config may lose one rule at once
    assert g.check("sha-half", ["a"], ["a", "b"]) == 0 and not g.holding
