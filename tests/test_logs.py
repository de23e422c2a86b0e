"""Logs a journal can sort (issue 31 item 5): every line of netlimitd and the
sidecar carries its level -- sd-daemon ``<N>`` prefixes when stderr is the
journal's stream, a level word otherwise -- and ``--log-format json`` writes one
object a line with the record's fields.

The journal is recognised as journald does it for its clients: $JOURNAL_STREAM
names the device:inode of stderr; the tests hand the real process a file as
stderr and its device:inode in $JOURNAL_STREAM.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from sidecar_proc import LogProc, Sidecar, free_port, logged_at, netlimit_cmd, request, write_config

from netlimit import logs

TEXT_HEAD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")


def _record(msg: str, level: int = logging.WARNING, name: str = "netlimit.daemon", **extra) -> logging.LogRecord:
    rec = logging.makeLogRecord({"msg": msg, "levelno": level, "levelname": logging.getLevelName(level), "name": name})
    rec.__dict__.update(extra)
    return rec


def test_priorities_are_sd_daemon_s():
    assert [logs.priority(lv) for lv in (10, 20, 30, 40, 50)] == [7, 6, 4, 3, 2]
    assert logs.priority(25) == 6 and logs.priority(5) == 7


def test_journal_stream_must_name_this_stderr(tmp_path, monkeypatch):
    f = tmp_path / "err"
    other = tmp_path / "other"
    other.write_text("")
    with open(f, "w") as stream:
        s = os.fstat(stream.fileno())
        monkeypatch.setenv("JOURNAL_STREAM", f"{s.st_dev}:{s.st_ino}")
        assert logs.under_journald(stream)
        o = os.stat(other)
        monkeypatch.setenv("JOURNAL_STREAM", f"{o.st_dev}:{o.st_ino}")  # inherited, stderr redirected
        assert not logs.under_journald(stream)
        for bad in ("", "8:", ":9", "x:y", f"{s.st_dev}-{s.st_ino}"):
            monkeypatch.setenv("JOURNAL_STREAM", bad)
            assert not logs.under_journald(stream)
        monkeypatch.delenv("JOURNAL_STREAM")
        assert not logs.under_journald(stream)
    assert not logs.under_journald(io.StringIO())  # no file descriptor


def test_text_lines_carry_time_and_level_and_every_line_of_a_traceback_too():
    fmt = logs.TextFormatter("netlimitd: ")
    line = fmt.format(_record("drift: rule x missing"))
    assert TEXT_HEAD.match(line) and line.endswith(" WARNING netlimitd: drift: rule x missing"), line
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        rec = _record("failed", logging.ERROR, exc_info=sys.exc_info())
    lines = fmt.format(rec).split("\n")
    assert len(lines) > 3 and all(TEXT_HEAD.match(x) and " ERROR netlimitd: " in x for x in lines), lines
    assert lines[-1].endswith("RuntimeError: boom")


def test_journal_lines_carry_the_priority_and_no_time():
    fmt = logs.TextFormatter("netlimitd: ", journal=True)
    assert fmt.format(_record("start: applied", logging.INFO)) == "<6>netlimitd: start: applied"
    assert fmt.format(_record("a\nb", logging.ERROR)) == "<3>netlimitd: a\n<3>netlimitd: b"
    assert logs.TextFormatter(journal=True).format(_record("x", logging.DEBUG)) == "<7>x"


def test_json_one_object_a_line_with_fields():
    fmt = logs.JsonFormatter()
    rec = _record("rule %r over limit", logging.INFO, "netlimit.limit", rule="login", client="10.0.0.1")
    rec.args = ("login",)
    line = fmt.format(rec)
    obj = json.loads(line)
    assert list(obj)[:4] == ["time", "level", "logger", "message"]
    assert obj["level"] == "info" and obj["logger"] == "netlimit.limit"
    assert obj["message"] == "rule 'login' over limit"
    assert (obj["rule"], obj["client"]) == ("login", "10.0.0.1")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d", obj["time"]), obj["time"]
    assert abs(logged_at(re.match(".*", line)) - rec.created) < 0.002
    # under journald: the priority first, then the bare object
    j = logs.JsonFormatter(journal=True).format(_record("x", logging.ERROR))
    assert j.startswith("<3>{") and json.loads(j[3:])["level"] == "error"


@given(st.text(max_size=300), st.sampled_from([10, 20, 30, 40, 50]))
def test_any_message_is_one_json_line_that_reads_back(msg, level):
    line = logs.JsonFormatter().format(_record(msg, level))
    assert "\n" not in line and "\r" not in line
    assert json.loads(line)["message"] == msg


@given(st.text(max_size=200))
def test_any_message_every_text_line_has_a_level(msg):
    out = logs.TextFormatter("p: ", journal=True).format(_record(msg, logging.WARNING))
    assert all(x.startswith("<4>p: ") for x in out.split("\n"))


def test_json_message_is_bounded():
    obj = json.loads(logs.JsonFormatter().format(_record("x" * 100_000)))
    assert len(obj["message"]) < logs.MAX_MESSAGE + 100 and obj["message"].endswith("more characters)")


def test_bad_level_or_format_is_refused():
    assert logs.check("info", "json") is None and logs.check("DEBUG", "Text") is None
    assert "--log-level 'loud'" in logs.check("loud", "text")
    assert "NETLIMIT_LOG_FORMAT" in logs.check("info", "xml")


# --- the real sidecar ---------------------------------------------------------------

BAD = "version: 1\nhttp:\n  domain: api\n  descriptors:\n    - key: k\n      rate_limit: {unit: fortnight, requests_per_unit: 1}\n"
GOOD = """\
version: 1
http:
  domain: api
  actions:
    - [remote_address]
  descriptors:
    - key: remote_address
      rate_limit: {unit: minute, requests_per_unit: 1}
"""


def _run(args: list[str], env: dict | None = None, stderr=subprocess.PIPE) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*netlimit_cmd(), *args], stderr=stderr, stdout=subprocess.PIPE, text=True, timeout=60, env=env
    )


def test_sidecar_json_errors_name_file_line_col(tmp_path):
    cfg = write_config(tmp_path / "bad.yaml", BAD)
    p = _run(["sidecar", "--config", str(cfg), "--listen", "127.0.0.1:0", "--log-format", "json"])
    assert p.returncode == 1
    objs = [json.loads(x) for x in p.stderr.splitlines()]
    assert [o["level"] for o in objs] == ["error", "error"]
    assert {k: objs[0][k] for k in ("file", "line", "col", "rule")} == {
        "file": str(cfg),
        "line": 6,
        "col": 26,
        "rule": "http",
    }
    assert objs[1]["message"] == f"{cfg}: 1 problem; the sidecar did not start"


def test_sidecar_log_format_from_the_environment_and_refused_when_wrong(tmp_path):
    cfg = write_config(tmp_path / "bad.yaml", BAD)
    env = {**os.environ, "NETLIMIT_LOG_FORMAT": "json"}
    p = _run(["sidecar", "--config", str(cfg), "--listen", "127.0.0.1:0"], env)
    assert p.returncode == 1 and all(json.loads(x)["level"] == "error" for x in p.stderr.splitlines())
    env["NETLIMIT_LOG_FORMAT"] = "xml"
    p = _run(["sidecar", "--config", str(cfg), "--listen", "127.0.0.1:0"], env)
    assert p.returncode == 64 and "--log-format 'xml'" in p.stderr


def test_sidecar_under_journald_every_line_has_a_priority(tmp_path):
    cfg = write_config(tmp_path / "bad.yaml", BAD)
    err = tmp_path / "stderr"
    with open(err, "w") as f:
        s = os.fstat(f.fileno())
        env = {**os.environ, "JOURNAL_STREAM": f"{s.st_dev}:{s.st_ino}"}
        p = _run(["sidecar", "--config", str(cfg), "--listen", "127.0.0.1:0"], env, stderr=f)
    assert p.returncode == 1
    assert err.read_text().splitlines() == [
        f"<3>{cfg}:6:26: http: 'unit' must be one of 'second', 'minute', 'hour', 'day', 'week', 'month', 'year', "
        "got 'fortnight'",
        f"<3>{cfg}: 1 problem; the sidecar did not start",
    ]


def test_running_sidecar_json_log_level_and_rule_fields(tmp_path):
    """A running sidecar in JSON at --log-level info: its start lines, a rule over
    its limit with rule and client fields; at warning the info lines are gone."""
    cfg = write_config(tmp_path / "ok.yaml", GOOD)
    body = {"domain": "api", "descriptors": [{"entries": [{"key": "remote_address", "value": "10.1.2.3"}]}]}
    sc = Sidecar(cfg, "--log-format", "json")
    try:
        assert [sc.post_json("/v1/check", body).status for _ in range(2)] == [200, 429]
        obj = json.loads(sc.wait_line(r'"rule": ').string)
        assert obj["level"] == "info" and obj["logger"] == "netlimit.limit"
        assert obj["client"] == "10.1.2.3" and obj["descriptor"] == {"remote_address": "10.1.2.3"}
        assert "over limit" in obj["message"]
    finally:
        sc.stop()
    assert sc.lines and all(json.loads(x)["level"] in ("info", "warning") for x in sc.lines), sc.lines

    port = free_port()
    quiet = LogProc([*netlimit_cmd(), "sidecar", "--config", str(cfg), "--listen", f"127.0.0.1:{port}",
                     "--log-level", "warning"])  # fmt: skip
    try:
        deadline = time.monotonic() + 15
        status = None
        while time.monotonic() < deadline and quiet.proc.poll() is None:
            try:
                status = [request(port, "POST", "/v1/check", {"Content-Type": "application/json"},
                                  json.dumps(body).encode()).status for _ in range(2)]  # fmt: skip
                break
            except OSError:
                time.sleep(0.1)
        assert status == [200, 429], quiet.log()
    finally:
        quiet.stop()
    # the "listening on" and "over limit" lines are info: not written at warning
    assert all(TEXT_HEAD.match(x) for x in quiet.lines), quiet.lines
    assert not any(" INFO " in x for x in quiet.lines), quiet.lines


def test_the_helpers_time_parser_reads_both_formats():
    now = time.time()
    text = logs.TextFormatter().format(logging.makeLogRecord({"msg": "x", "created": now, "msecs": now % 1 * 1000}))
    js = logs.JsonFormatter().format(logging.makeLogRecord({"msg": "x", "created": now}))
    for line in (text, js):
        assert abs(logged_at(re.match(".*", line)) - now) < 0.002, line


def test_daemon_flags_documented(tmp_path):
    out = _run(["daemon", "--help"]).stdout
    assert "--log-format" in out and "--log-level" in out
    assert Path(__file__).exists()


def test_an_uncaught_exception_is_logged_with_its_level_on_every_line(tmp_path):
    """A crash's traceback too: under journald each of its lines starts with <2>."""
    code = (
        "import sys, threading\n"
        "from netlimit import logs\n"
        "logs.setup('info', 'netlimitd: ')\n"
        "t = threading.Thread(target=lambda: 1 / 0, name='worker'); t.start(); t.join()\n"
        "raise RuntimeError('boom')\n"
    )
    err = tmp_path / "stderr"
    with open(err, "w") as f:
        s = os.fstat(f.fileno())
        env = {**os.environ, "JOURNAL_STREAM": f"{s.st_dev}:{s.st_ino}"}
        p = subprocess.run([sys.executable, "-c", code], stderr=f, env=env, timeout=60)
    assert p.returncode == 1
    lines = err.read_text().splitlines()
    assert lines and all(x.startswith("<2>netlimitd: ") for x in lines), lines
    assert "<2>netlimitd: uncaught ZeroDivisionError in thread worker: division by zero" in lines
    assert "<2>netlimitd: uncaught RuntimeError: boom" in lines and lines[-1] == "<2>netlimitd: RuntimeError: boom"
