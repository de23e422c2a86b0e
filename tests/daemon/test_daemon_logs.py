"""netlimitd's log lines carry their level (issue 31 item 5): a real daemon in a
namespace, its stderr a file; under "journald" ($JOURNAL_STREAM naming that
file's device:inode, as systemd sets it) every line starts with the sd-daemon
priority, so `journalctl -p warning` shows a rejected file; in JSON every line
is an object with the problem's file, line and column.

The level and format come from $NETLIMIT_LOG_LEVEL / $NETLIMIT_LOG_FORMAT here
(the flags --log-level / --log-format are the same options).
"""

from __future__ import annotations

import json
import os
import re
import signal

import pytest
from daemon_proc import config_text, wait_for

pytestmark = pytest.mark.netns

BAD = config_text().replace("limit: 100/second", "limit: 100/fortnight")


def _journal_env(d) -> dict:
    d.log.touch()
    s = os.stat(d.log)
    return {**os.environ, "NETLIMIT_BACKEND": "nftables", "JOURNAL_STREAM": f"{s.st_dev}:{s.st_ino}"}


def test_under_journald_every_line_has_its_priority(daemon_factory):
    d = daemon_factory(config_text())
    d.env = _journal_env(d)
    d.start()
    wait_for(lambda: "<6>netlimitd: running:" in d.log.read_text(), 20, "the running line")
    d.edit(BAD)
    wait_for(lambda: "new config rejected" in d.log.read_text(), 20, "the rejection")
    assert d.stop() == 0
    lines = d.log.read_text().splitlines()
    assert lines and all(re.match(r"<[2-7]>netlimitd: ", x) for x in lines), lines
    assert any(x.startswith("<6>netlimitd: start: ") for x in lines), lines
    # what `journalctl -p err` shows: the rejection with its position, nothing of the routine
    errors = [x[3:] for x in lines if x[:3] in ("<3>", "<2>")]
    assert any(f"rejected: {d.config}:8:12: udp-flood: bad rate unit 'fortnight'" in x for x in errors), lines
    assert not any("start: " in x or "running:" in x for x in errors), errors


def test_json_lines_with_the_problem_position_and_the_level_from_the_environment(daemon_factory):
    d = daemon_factory(config_text())
    d.env = {**os.environ, "NETLIMIT_BACKEND": "nftables", "NETLIMIT_LOG_FORMAT": "json"}
    d.start()
    d.edit(BAD)
    wait_for(lambda: "new config rejected" in d.log.read_text(), 20, "the rejection")
    assert d.stop() == 0
    objs = [json.loads(x) for x in d.log.read_text().splitlines()]
    assert all(o["logger"].startswith("netlimit.") and o["level"] in ("info", "warning", "error") for o in objs)
    bad = [o for o in objs if "line" in o]
    assert len(bad) == 1 and bad[0]["level"] == "error", objs
    assert (bad[0]["file"], bad[0]["line"], bad[0]["col"], bad[0]["rule"]) == (str(d.config), 8, 12, "udp-flood")

    # at warning the info lines (start, running, the flush at stop) are left out
    d.log.write_text("")
    d.env = {**d.env, "NETLIMIT_LOG_LEVEL": "warning", "NETLIMIT_LOG_FORMAT": "text"}
    d.edit(config_text())
    d.start()
    d.edit(BAD)
    wait_for(lambda: "new config rejected" in d.log.read_text(), 20, "the rejection")
    assert d.stop() == 0
    lines = d.log.read_text().splitlines()
    assert lines and all(
        re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (WARNING|ERROR) netlimitd: ", x) for x in lines
    )


def test_sigusr1_writes_every_threads_stack_to_the_log_and_the_daemon_goes_on(daemon_factory):
    """Where a daemon hangs (the soak once saw one not stop within 40 s of SIGTERM):
    `kill -USR1` makes it write every thread's stack to stderr, from a C handler that
    answers even when the main thread is stuck in a call; the daemon keeps running."""
    d = daemon_factory(config_text())
    d.start()
    size = d.log.stat().st_size
    assert d.proc is not None
    d.proc.send_signal(signal.SIGUSR1)
    wait_for(lambda: "Current thread" in d.log.read_text()[size:], 10, "the stacks")
    dump = d.log.read_text()[size:]
    assert "service.py" in dump and "Thread 0x" in dump, dump[-3000:]
    assert d.status()["pid"] == d.proc.pid  # still answering
    assert d.stop() == 0
