"""Reading access logs: every format's fields, time zones, broken and hostile
lines (a reason, never an exception), gzip, stdin-like streams, detection."""

from __future__ import annotations

import datetime as dt
import gzip
import io
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from simlog import T0, combined, common, envoy, jsonl, write

from netlimit.simulate.logs import (
    MAX_LINE,
    OVERLONG,
    ClfTime,
    LogError,
    Needs,
    Source,
    detect,
    make_parser,
    open_log,
    parse_fields,
    timezone,
)

ALL = Needs(peer=True, request=True, headers=frozenset({"user-agent", "referer", "x-forwarded-for", "x-api-key"}))


def test_combined_fields():
    p = make_parser("combined", ALL)
    r = p(combined("10.0.0.1", T0, "/a/b?x=1", "POST", ua="curl/8", referer="http://r/"))
    assert r == (T0, "10.0.0.1", "POST", "/a/b?x=1", {"user-agent": "curl/8", "referer": "http://r/"})


def test_combined_reads_only_what_the_actions_need():
    p = make_parser("combined", Needs(peer=True))
    assert p(combined("10.0.0.1", T0, "/x")) == (T0, "10.0.0.1", "", "", {})
    # a request line that is not METHOD TARGET PROTOCOL matters only when the path is read
    line = '10.0.0.1 - - [14/Nov/2023:22:13:20 +0000] "\\x16\\x03\\x01" 400 150 "-" "-"'
    assert p(line) == (T0, "10.0.0.1", "", "", {})
    reason = make_parser("combined", ALL)(line)
    assert isinstance(reason, str) and "is not 'METHOD TARGET PROTOCOL'" in reason


def test_nginx_main_format_with_x_forwarded_for_and_extra_fields():
    p = make_parser("combined", ALL)
    line = combined("10.0.0.1", T0, "/", xff="198.51.100.7, 10.0.0.9") + " 0.004 upstream=1"
    r = p(line)
    assert not isinstance(r, str)
    assert r[4]["x-forwarded-for"] == "198.51.100.7, 10.0.0.9"
    # "-" is nginx's empty value: no header
    assert "x-forwarded-for" not in p(combined("10.0.0.1", T0, "/", xff="-"))[4]


def test_apache_escaped_quotes():
    line = '10.0.0.1 - frank [14/Nov/2023:22:13:20 +0000] "GET /q?a=\\"b\\" HTTP/1.0" 200 2326 "-" "Agent \\"X\\" 1.0"'
    r = make_parser("combined", ALL)(line)
    assert r == (T0, "10.0.0.1", "GET", '/q?a=\\"b\\"', {"user-agent": 'Agent \\"X\\" 1.0'})


def test_common_format():
    p = make_parser("common", Needs(peer=True, request=True))
    assert p(common("10.0.0.2", T0 + 5, "/login", "POST")) == (T0 + 5, "10.0.0.2", "POST", "/login", {})
    assert isinstance(p(combined("10.0.0.2", T0)), str)  # combined lines are not common ones


@pytest.mark.parametrize("offset", [0, -420, 330, 600, -60])
def test_the_zone_written_in_the_line_is_honoured(offset):
    p = make_parser("combined", Needs())
    assert p(combined("10.0.0.1", T0 + 3723, offset=offset))[0] == T0 + 3723


@given(st.integers(min_value=0, max_value=4_000_000_000), st.integers(min_value=-14 * 60, max_value=14 * 60))
@settings(max_examples=300, deadline=None)
def test_clf_time_agrees_with_datetime(t, offset):
    d = dt.datetime.fromtimestamp(t, dt.timezone(dt.timedelta(minutes=offset)))
    sign = "+" if offset >= 0 else "-"
    s = d.strftime("%d/%b/%Y:%H:%M:%S ") + f"{sign}{abs(offset) // 60:02d}{abs(offset) % 60:02d}"
    assert ClfTime()(s) == t


def test_zone_less_times_are_read_in_the_given_zone():
    line = '10.0.0.1 - - [14/Nov/2023:22:13:20] "GET / HTTP/1.1" 200 5 "-" "-"'
    assert make_parser("combined", Needs(), dt.UTC)(line)[0] == T0
    assert make_parser("combined", Needs(), timezone("+02:00"))(line)[0] == T0 - 7200
    paris = timezone("Europe/Paris")  # CET in November: UTC+1
    assert make_parser("combined", Needs(), paris)(line)[0] == T0 - 3600


def test_timezone_names():
    assert timezone("UTC") is dt.UTC
    assert timezone("-0700").utcoffset(None) == dt.timedelta(hours=-7)
    with pytest.raises(LogError, match="unknown time zone 'Mars/Olympus'"):
        timezone("Mars/Olympus")


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ('10.0.0.1 - - [14/Nov/2023:22:13:20 +0000] "GET / HTTP/1.1" 200 512 "-" "Mozilla/5.0 (X1', "unclosed quote"),
        ('10.0.0.1 - - [14/Nov/2023:22:13:20 +0000] "GET / HTT', "unclosed quote"),
        ("10.0.0.1 - - [14/Nov/2023:22:1", "no [time] field"),
        ("", "empty line"),
        ("   ", "empty line"),
        ("\x00\x01\x02 binary \xff garbage", "no [time] field"),
        ('10.0.0.1 - - [14/Foo/2023:22:13:20 +0000] "GET / HTTP/1.1" 200 5 "-" "-"', "bad time"),
        ('10.0.0.1 - - [14/Nov/2023:25:13:20 +0000] "GET / HTTP/1.1" 200 5 "-" "-"', "bad time"),
        ('10.0.0.1 - - [14/Nov/2023:22:61:20 +0000] "GET / HTTP/1.1" 200 5 "-" "-"', "bad time"),
        ('10.0.0.1 - - [31/Feb/2023:22:13:20 +0000] "GET / HTTP/1.1" 200 5 "-" "-"', "bad time"),
        ('10.0.0.1 - - [yesterday] "GET / HTTP/1.1" 200 5 "-" "-"', "bad time"),
        ('10.0.0.1 - - [14/Nov/2023:22:13:20 +0000] "GET / HTTP/1.1" 200 512', "common format, not combined"),
        ('10.0.0.1 - - [14/Nov/2023:22:13:20 +0000] "GET / HTTP/1.1" abc 512 "-" "-"', "not in the combined format"),
    ],
)
def test_broken_lines_are_reasons(line, why):
    r = make_parser("combined", ALL)(line)
    assert isinstance(r, str) and why in r, r


def test_leap_days_and_year_ends():
    p = make_parser("combined", Needs())
    assert p('1.2.3.4 - - [29/Feb/2024:00:00:00 +0000] "GET / HTTP/1.1" 200 5 "-" "-"')[0] == 1709164800
    assert p('1.2.3.4 - - [31/Dec/2023:23:59:59 -0100] "GET / HTTP/1.1" 200 5 "-" "-"')[0] == 1704070799


# --------------------------------------------------------------------------- JSON


def test_json_usual_nginx_names_without_a_mapping():
    p = make_parser("json", ALL)
    line = jsonl(
        time_iso8601="2023-11-14T23:13:20+01:00",
        remote_addr="10.0.0.3",
        request_method="PUT",
        request_uri="/v1/x?y",
        http_user_agent="ua/2",
        http_x_api_key="k-123",
        status=200,
    )
    assert p(line) == (T0, "10.0.0.3", "PUT", "/v1/x?y", {"user-agent": "ua/2", "x-api-key": "k-123"})


def test_json_field_mapping():
    fields = parse_fields(["ts=when,ip=client.addr", "path=u", "header:X-Api-Key=key", "method=verb"])
    assert fields == {"ts": "when", "ip": "client.addr", "path": "u", "h:x-api-key": "key", "method": "verb"}
    p = make_parser("json", ALL, fields=fields)
    line = jsonl(when=T0 * 1000 + 250, client={"addr": "[2001:db8::1]:5555"}, u="/k", key="abc", verb="GET")
    assert p(line) == (T0 + 0.25, "2001:db8::1", "GET", "/k", {"x-api-key": "abc"})


def test_json_request_line_and_epoch_strings():
    p = make_parser("json", Needs(peer=True, request=True))
    r = p(jsonl(msec="1700000000.125", remote_addr="10.0.0.4:40000", request="DELETE /z HTTP/1.1"))
    assert r == (T0 + 0.125, "10.0.0.4", "DELETE", "/z", {})


def test_json_zone_less_iso_time_uses_the_given_zone():
    p = make_parser("json", Needs(), timezone("Asia/Kolkata"))
    assert p(jsonl(time="2023-11-15T03:43:20", remote_addr="1.2.3.4"))[0] == T0


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ('{"time": 1700000000, "remote_addr": "1.2.3.4"', "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"remote_addr": "1.2.3.4", "request_uri": "/"}', "no time field"),
        ('{"time": "soon", "remote_addr": "1.2.3.4", "request_uri": "/"}', "bad time"),
        ('{"time": -5, "remote_addr": "1.2.3.4", "request_uri": "/"}', "bad time"),
        ('{"time": 1700000000, "request_uri": "/"}', "no client address"),
        ('{"time": 1700000000, "remote_addr": "1.2.3.4"}', "no request path"),
    ],
)
def test_json_broken_lines_are_reasons(line, why):
    p = make_parser("json", Needs(peer=True, request=True))
    r = p(line)
    assert isinstance(r, str) and why in r, r


def test_bad_field_spec():
    with pytest.raises(LogError, match="expected ROLE=FIELD"):
        parse_fields(["ts"])


# --------------------------------------------------------------------------- Envoy


def test_envoy_default_format():
    p = make_parser("envoy", Needs(request=True, headers=frozenset({"user-agent", "x-forwarded-for", "host"})))
    r = p(envoy("203.0.113.9,10.0.0.1", T0 + 0.31, "/api/v1/locations", "POST", ua="nsq2http"))
    assert r == (
        T0 + 0.31,
        "10.0.0.1",  # the last hop: what Envoy appended (use_remote_address)
        "POST",
        "/api/v1/locations",
        {"x-forwarded-for": "203.0.113.9,10.0.0.1", "user-agent": "nsq2http", "host": "api.example"},
    )


def test_envoy_without_x_forwarded_for_has_no_client():
    line = envoy("-", T0)
    assert "no client address" in make_parser("envoy", Needs(peer=True))(line)
    assert make_parser("envoy", Needs(peer=False))(line)[1] == ""


# --------------------------------------------------------------------------- detection


def test_detect():
    assert detect([combined("1.2.3.4", T0)] * 3) == "combined"
    assert detect([common("1.2.3.4", T0)] * 3) == "common"
    assert detect([envoy("1.2.3.4", T0)] * 3) == "envoy"
    assert detect([jsonl(time=T0, remote_addr="1.2.3.4")] * 3) == "json"
    assert detect(["", combined("1.2.3.4", T0), "garbage", combined("1.2.3.4", T0)]) == "combined"
    assert detect(["hello world", "nothing here"]) is None
    assert detect([]) is None


# --------------------------------------------------------------------------- reading files


def _lines(path) -> list[str]:
    log = open_log(Source(str(path)))
    try:
        return [ln for chunk in log.chunks() for ln in chunk]
    finally:
        log.close()


def test_gzip_is_recognised_by_its_bytes_not_its_name(tmp_path):
    lines = [combined("10.0.0.1", T0 + i) for i in range(1000)]
    write(tmp_path / "a.log.gz", lines, gz=True)
    write(tmp_path / "rotated.1", lines, gz=True)
    write(tmp_path / "plain.gz", lines)  # named .gz, not compressed
    for name in ("a.log.gz", "rotated.1", "plain.gz"):
        assert _lines(tmp_path / name) == lines


def test_truncated_gzip_ends_with_an_error_and_the_lines_before_it(tmp_path):
    data = gzip.compress("".join(combined("10.0.0.1", T0 + i) + "\n" for i in range(20000)).encode())
    (tmp_path / "cut.gz").write_bytes(data[: len(data) // 2])
    log = open_log(Source(str(tmp_path / "cut.gz")))
    got = [ln for chunk in log.chunks() for ln in chunk]
    log.close()
    assert 0 < len(got) < 20000
    assert log.error is not None and "ends early or is corrupt" in log.error
    assert all(ln == combined("10.0.0.1", T0 + i) for i, ln in enumerate(got[:-1]))


def test_overlong_lines_are_bounded_and_numbering_continues(tmp_path):
    lines = ["first", "x" * (MAX_LINE * 3 + 17), "third", "y" * (MAX_LINE + 1), "fifth"]
    write(tmp_path / "long.log", lines)
    got = _lines(tmp_path / "long.log")
    assert got == ["first", OVERLONG, "third", OVERLONG, "fifth"]
    assert got[1] is OVERLONG


def test_crlf_and_no_final_newline(tmp_path):
    (tmp_path / "w.log").write_bytes(b"a\r\nb\r\nc")
    assert _lines(tmp_path / "w.log") == ["a", "b", "c"]


def test_invalid_utf8_is_replaced_not_fatal(tmp_path):
    (tmp_path / "b.log").write_bytes(b"ok\n\xff\xfe bad \xc3\n")
    assert _lines(tmp_path / "b.log") == ["ok", "\ufffd\ufffd bad \ufffd"]


def test_stdin(monkeypatch):
    data = "".join(combined("10.0.0.1", T0 + i) + "\n" for i in range(3)).encode()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(io.BytesIO(gzip.compress(data)))))
    log = open_log(Source("-"))
    assert log.source.label == "<stdin>"
    assert [ln for c in log.chunks() for ln in c] == data.decode().splitlines()


def test_missing_and_unreadable_files(tmp_path):
    with pytest.raises(LogError, match=r"nope\.log: no such file"):
        open_log(Source(str(tmp_path / "nope.log")))
    with pytest.raises(LogError, match="is a directory"):
        open_log(Source(str(tmp_path)))
