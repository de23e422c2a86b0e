"""The commands as a user runs them: exit codes, what goes to stdout and
stderr, JSON, stdin and gzip, and suggest's file passing `netlimit validate`."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml
from simlog import T0, combined, config, three_abusers, write

EXE = str(Path(sys.executable).with_name("netlimit"))

TEN = """\
  actions: [[remote_address]]
  descriptors:
    - key: remote_address
      rate_limit: {unit: second, requests_per_unit: 10}
      algorithm: token_bucket
"""


@dataclass
class Ran:
    returncode: int
    stdout_text: str
    stderr_text: str


def run(*args: str, stdin: bytes | None = None) -> Ran:
    p = subprocess.run([EXE, *args], input=stdin, capture_output=True, timeout=120)
    r = Ran(p.returncode, p.stdout.decode(), p.stderr.decode())
    assert "Traceback" not in r.stderr_text, r.stderr_text
    return r


def _abusers(tmp_path: Path) -> Path:
    return write(tmp_path / "access.log", [combined(ip, t) for t, ip in three_abusers(60)])


def test_simulate_json(tmp_path):
    cfg = config(tmp_path / "rules.yaml", TEN)
    p = run("simulate", "--config", str(cfg), "--json", str(_abusers(tmp_path)))
    assert p.returncode == 0, p.stderr_text
    assert p.stderr_text == ""
    doc = json.loads(p.stdout_text)
    assert (doc["lines"], doc["requests"], doc["denied"], doc["unreadable"]) == (15000, 15000, 7200, 0)
    assert doc["first"] == "2023-11-14T22:13:20Z" and doc["last"] == "2023-11-14T22:14:19Z"
    (r,) = doc["rules"]
    assert r["limit"] == {
        "requests_per_unit": 10,
        "unit": "second",
        "period": 1.0,
        "algorithm": "token_bucket",
        "burst": None,
    }
    assert (r["requests"], r["denied"], r["denied_pct"], r["clients"], r["clients_denied"]) == (
        15000,
        7200,
        48.0,
        1003,
        3,
    )
    assert r["peak"] == {"p50": 1, "p90": 1, "p99": 1, "p99.9": 50, "max": 50}
    assert r["peak_counts"] == [[1, 1000], [50, 3]]
    assert [c["client"] for c in r["top_denied"]] == ["203.0.113.1", "203.0.113.2", "203.0.113.3"]
    assert {a["algorithm"]: a["denied"] for a in r["algorithms"]}["sliding_window_counter"] == 8100
    assert sum(r["timeline"]["admitted"]) + sum(r["timeline"]["denied"]) == 15000


def test_simulate_table(tmp_path):
    cfg = config(tmp_path / "rules.yaml", TEN)
    p = run("simulate", "-c", str(cfg), str(_abusers(tmp_path)))
    assert p.returncode == 0, p.stderr_text
    out = p.stdout_text
    assert "15,000 requests" in out and "7,200 denied (48%)" in out
    assert "sliding_window_counter" in out and "8,100 (54.00%)" in out
    assert "203.0.113.1" in out and "1 / 1 / 1 / 50 / 50 per s" in out


def test_unreadable_lines_are_listed_with_file_and_line(tmp_path):
    lines = [combined("10.0.0.1", T0 + i) for i in range(20)]
    for i in (2, 5, 6, 9, 11, 12, 15):
        lines[i] = lines[i][: 30 + i]
    log = write(tmp_path / "broken.log", lines)
    cfg = config(tmp_path / "rules.yaml", TEN)
    p = run("simulate", "-c", str(cfg), "--json", str(log))
    assert p.returncode == 0
    err = p.stderr_text.splitlines()
    assert err[0] == "7 lines could not be read (not counted):"
    assert err[1].startswith(f"  {log}:3: ")
    assert [e.split(":")[1] for e in err[1:6]] == ["3", "6", "7", "10", "12"]
    assert err[6] == "  ... and 2 more"
    assert json.loads(p.stdout_text)["requests"] == 13


def test_nothing_readable_is_an_error_not_a_traceback(tmp_path):
    log = write(tmp_path / "junk.log", ["hello", "world"])
    cfg = config(tmp_path / "rules.yaml", TEN)
    p = run("simulate", "-c", str(cfg), str(log))
    assert p.returncode == 1
    assert "cannot tell the log format from its first lines (the first: 'hello')" in p.stderr_text
    p = run("simulate", "-c", str(cfg), "--format", "combined", str(log))
    assert p.returncode == 1
    assert f"{log}:1: no [time] field" in p.stderr_text and "no request could be read" in p.stderr_text


def test_usage_and_config_errors(tmp_path):
    log = _abusers(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "version: 1\nhttp:\n  domain: t\n  descriptors:\n    - key: remote_address\n      rate_limit: {unit: fortnight, requests_per_unit: 1}\n"
    )
    p = run("simulate", "-c", str(bad), str(log))
    assert p.returncode == 1 and f"{bad}:6:" in p.stderr_text
    net_only = tmp_path / "net.yaml"
    net_only.write_text("version: 1\n")
    p = run("simulate", "-c", str(net_only), str(log))
    assert p.returncode == 1 and "no 'http:' section" in p.stderr_text
    cfg = config(tmp_path / "rules.yaml", TEN)
    p = run("simulate", "-c", str(cfg), str(tmp_path / "missing.log"))
    assert p.returncode == 1 and "missing.log: no such file" in p.stderr_text
    p = run("simulate", "-c", str(cfg), "--format", "w3c", str(log))
    assert p.returncode == 64 and "--format 'w3c'" in p.stderr_text
    p = run("simulate", "-c", str(cfg), "--timezone", "Nowhere/Land", str(log))
    assert p.returncode == 64 and "unknown time zone" in p.stderr_text
    p = run("simulate", "-c", str(cfg), "--field", "ts", str(log))
    assert p.returncode == 64 and "expected ROLE=FIELD" in p.stderr_text


def test_stdin_gzip_and_report(tmp_path):
    cfg = config(tmp_path / "rules.yaml", TEN)
    data = _abusers(tmp_path).read_bytes()
    report = tmp_path / "r.html"
    p = run("simulate", "-c", str(cfg), "--json", "--report", str(report), "--progress", "-", stdin=gzip.compress(data))
    assert p.returncode == 0, p.stderr_text
    doc = json.loads(p.stdout_text)
    assert doc["files"] == ["<stdin>"] and doc["denied"] == 7200
    page = report.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count('<img src="data:image/png;base64,') == 4
    assert "http://" not in page and "https://" not in page  # nothing to fetch


def test_json_logs_with_a_field_mapping(tmp_path):
    body = """\
  actions: [["header:X-Api-Key"]]
  descriptors:
    - key: "header:X-Api-Key"
      rate_limit: {unit: minute, requests_per_unit: 3}
      algorithm: sliding_window_log
"""
    cfg = config(tmp_path / "rules.yaml", body)
    lines = [
        json.dumps({"ts": f"2023-11-14T22:13:{20 + i:02d}Z", "addr": "10.0.0.1", "key": f"k{i % 2}"}) for i in range(10)
    ]
    log = write(tmp_path / "app.jsonl", lines)
    p = run(
        "simulate", "-c", str(cfg), "--json", "--field", "ts=ts,ip=addr", "--field", "header:X-Api-Key=key", str(log)
    )
    assert p.returncode == 0, p.stderr_text
    (r,) = json.loads(p.stdout_text)["rules"]
    assert (r["requests"], r["denied"], r["clients"]) == (10, 4, 2)  # 5 per key, 3 per minute each
    # without the mapping the header is never found: said, not silently ignored
    p = run("simulate", "-c", str(cfg), "--json", "--field", "ts=ts,ip=addr", str(log))
    assert p.returncode == 0
    assert "the actions read header 'x-api-key', and no field of the log holds it" in p.stderr_text


def test_a_header_the_format_does_not_record_is_warned_about(tmp_path):
    body = """\
  actions: [["header:X-Api-Key"]]
  descriptors:
    - key: "header:X-Api-Key"
      rate_limit: {unit: minute, requests_per_unit: 3}
"""
    cfg = config(tmp_path / "rules.yaml", body)
    p = run("simulate", "-c", str(cfg), str(_abusers(tmp_path)))
    assert p.returncode == 0
    assert "which the combined format does not record" in p.stderr_text


# --------------------------------------------------------------------------- suggest


def _validate(tmp_path: Path, text: str) -> None:
    f = tmp_path / "suggested.yaml"
    f.write_text(text)
    v = run("validate", str(f))
    assert v.returncode == 0, v.stdout_text + v.stderr_text


def test_suggest_without_a_file(tmp_path):
    p = run("suggest", "--log", str(_abusers(tmp_path)))
    assert p.returncode == 0, p.stderr_text
    _validate(tmp_path, p.stdout_text)
    doc = yaml.safe_load(p.stdout_text)
    assert doc["http"]["actions"] == [["remote_address"]]
    (d,) = doc["http"]["descriptors"]
    # 2x the p99 peak (1 per second): 2 per second; every algorithm spares the thousand,
    # and the sliding counter denies the abusers most
    assert d == {
        "key": "remote_address",
        "rate_limit": {"unit": "second", "requests_per_unit": 2},
        "algorithm": "sliding_window_counter",
    }
    assert p.stdout_text.startswith("# netlimit suggest: limits for one limit per remote_address and second")
    assert "# target: 2x the peak of p99 of the clients" in p.stdout_text
    err = p.stderr_text
    assert "remote_address: 2 per second, sliding_window_counter: would have denied 8,820 of 15,000 requests" in err
    assert "from 3 of 1,003 clients" in err
    assert "token_bucket 8,640 (3 clients)" in err


def test_suggest_deny_clients_with_a_file(tmp_path):
    body = (
        TEN
        + """\
    - key: remote_address
      value: 192.0.2.1
      rate_limit: {unit: minute, requests_per_unit: 7}
      algorithm: fixed_window
"""
    )
    cfg = config(tmp_path / "rules.yaml", body)
    p = run("suggest", "--log", str(_abusers(tmp_path)), "-c", str(cfg), "--deny-clients", "0.5%", "--headroom", "2")
    assert p.returncode == 64 and "not both" in p.stderr_text
    p = run("suggest", "--log", str(_abusers(tmp_path)), "-c", str(cfg), "--deny-clients", "0.5%")
    assert p.returncode == 0, p.stderr_text
    _validate(tmp_path, p.stdout_text)
    d1, d2 = yaml.safe_load(p.stdout_text)["http"]["descriptors"]
    # at most 0.5% of 1003 clients (5) above the limit: 1 per second leaves only the three above
    assert d1["rate_limit"]["requests_per_unit"] == 1
    assert d2 == {
        "key": "remote_address",
        "value": "192.0.2.1",
        "rate_limit": {"unit": "minute", "requests_per_unit": 7},
        "algorithm": "fixed_window",
    }
    assert "# remote_address_192.0.2.1: no request of the log matched it; left as it was" in p.stdout_text


def test_suggest_from_stdin_and_bad_targets(tmp_path):
    data = _abusers(tmp_path).read_bytes()
    p = run("suggest", "--log", "-", "--unit", "minute", "--headroom", "1.5x", "--over", "p99.9", stdin=data)
    assert p.returncode == 0, p.stderr_text
    _validate(tmp_path, p.stdout_text)
    (d,) = yaml.safe_load(p.stdout_text)["http"]["descriptors"]
    # 1.5 x 6 per minute: p99.9 of every client would be the abusers' 3000 per minute; they are set aside
    assert d["rate_limit"] == {"unit": "minute", "requests_per_unit": 9}
    assert "set aside 3 outlier clients of 1,003 (peak 3000/minute (3 clients)" in p.stderr_text
    for args in (["--deny-clients", "150%"], ["--headroom", "0.5x"], ["--over", "p0"], ["--unit", "fortnight"]):
        p = run("suggest", "--log", "-", *args, stdin=data)
        assert p.returncode == 64, (args, p.stderr_text)


def test_hostile_keys_are_shown_not_interpreted(tmp_path):
    """Counter keys come from requests: rich markup, formulas, escape codes and long
    values in them reach the table, the report and JSON intact and harmless."""
    body = """\
  actions: [["header:X-Api-Key"]]
  descriptors:
    - key: "header:X-Api-Key"
      rate_limit: {unit: second, requests_per_unit: 1}
"""
    cfg = config(tmp_path / "rules.yaml", body)
    keys = ["[/]", "[bold]x", "$\\\\frac{1}{0}$ $x", "\x1b[31mred\x1b[0m", "k" * 5000, "<script>alert(1)</script>"]
    lines = [json.dumps({"time": T0, "remote_addr": "10.0.0.1", "http_x_api_key": k}) for k in keys for _ in range(3)]
    log = write(tmp_path / "h.jsonl", lines)
    p = run("simulate", "-c", str(cfg), "--report", str(tmp_path / "h.html"), str(log))
    assert p.returncode == 0, p.stderr_text
    assert "[/]" in p.stdout_text and "[bold]x" in p.stdout_text
    assert "\x1b" not in p.stdout_text and "\\x1b[31mred" in p.stdout_text
    page = (tmp_path / "h.html").read_text()
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    p = run("simulate", "-c", str(cfg), "--json", str(log))
    doc = json.loads(p.stdout_text)
    assert sorted(c["client"] for c in doc["rules"][0]["top_denied"]) == sorted(keys)
