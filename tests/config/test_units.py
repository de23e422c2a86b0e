"""Units: parsing what operators type, and exact round trips (hypothesis)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from netlimit.config.units import (
    PortRange,
    Rate,
    format_bandwidth,
    format_rate,
    format_size,
    parse_bandwidth,
    parse_port,
    parse_rate,
    parse_size,
)


@pytest.mark.parametrize(
    "text,count,unit",
    [
        ("100/second", 100, "second"),
        ("100/s", 100, "second"),
        ("6/m", 6, "minute"),
        ("3/minute", 3, "minute"),
        ("2/h", 2, "hour"),
        ("1/day", 1, "day"),
        (" 7 / Sec ", 7, "second"),
        ("5/mins", 5, "minute"),
        ("10/hours", 10, "hour"),
        ("4/d", 4, "day"),
    ],
)
def test_parse_rate(text, count, unit):
    assert parse_rate(text) == Rate(count, unit)


@pytest.mark.parametrize(
    "text,rate,period,exact",
    [
        ("3/10s", Rate(3, "second", 10), 10, (18, "minute")),
        ("5/2 minutes", Rate(5, "minute", 2), 120, (150, "hour")),
        ("1/1s", Rate(1, "second", 1), 1, (1, "second")),
        ("2/7s", Rate(2, "second", 7), 7, None),
        ("10/30s", Rate(10, "second", 30), 30, (20, "minute")),
    ],
)
def test_multiplied_periods(text, rate, period, exact):
    r = parse_rate(text)
    assert (r, r.period, r.exact()) == (rate, period, exact)


@given(st.integers(1, 10**6), st.integers(1, 1000), st.sampled_from(["second", "minute", "hour", "day"]))
def test_exact_is_the_same_rate(count, every, unit):
    r = Rate(count, unit, every)
    assert parse_rate(str(r)) == r
    e = r.exact()
    if e is not None:
        assert e[0] * r.period == count * {"second": 1, "minute": 60, "hour": 3600, "day": 86400}[e[1]]


@pytest.mark.parametrize(
    "text,message",
    [
        ("100", "bad rate '100': expected N/second|minute|hour|day (also 100/s, 6/m, 3/10s)"),
        (
            "3/fortnight",
            "bad rate unit 'fortnight' in '3/fortnight': expected second, minute, hour or day (s, m, h, d)",
        ),
        ("0/s", "rate '0/s' must be at least 1 per period"),
        ("3/0s", "rate '3/0s': the period must be at least 1 second"),
        ("-1/s", "bad rate '-1/s': expected N/second|minute|hour|day (also 100/s, 6/m, 3/10s)"),
        ("1.5/s", "bad rate '1.5/s': expected N/second|minute|hour|day (also 100/s, 6/m, 3/10s)"),
    ],
)
def test_parse_rate_errors(text, message):
    with pytest.raises(ValueError) as exc:
        parse_rate(text)
    assert str(exc.value) == message


def test_rate_needs_text():
    with pytest.raises(ValueError, match="rate must be text like '100/second', got 100"):
        parse_rate(100)


@given(st.integers(1, 10**9), st.sampled_from(["second", "minute", "hour", "day"]))
def test_rate_round_trip(count, unit):
    r = Rate(count, unit)
    assert parse_rate(format_rate(r)) == r
    assert r.per_second == count / {"second": 1, "minute": 60, "hour": 3600, "day": 86400}[unit]


@pytest.mark.parametrize(
    "text,bits",
    [
        ("10mbit", 10_000_000),
        ("1gbit", 10**9),
        ("64kbit", 64_000),
        ("100bit", 100),
        ("1.5mbit", 1_500_000),
        ("1mbps", 8_000_000),
        ("10 Mbit", 10_000_000),
        ("2tbit", 2 * 10**12),
    ],
)
def test_parse_bandwidth(text, bits):
    assert parse_bandwidth(text) == bits


@pytest.mark.parametrize(
    "value,message",
    [
        (10, "bandwidth 10 has no unit: write e.g. '10mbit' (bit, kbit, mbit, gbit; bps = bytes/s)"),
        ("10", "bandwidth '10' has no unit: write e.g. '10mbit' (bit, kbit, mbit, gbit; bps = bytes/s)"),
        (
            "10mb",
            "bad bandwidth unit 'mb' in '10mb': expected bit, kbit, mbit, gbit, tbit (or bps, kbps, mbps, gbps for bytes/s)",
        ),
        ("fast", "bad bandwidth 'fast': expected a number and a unit, e.g. 10mbit"),
        ("1bit", "bandwidth '1bit' is below 8 bit/s"),
    ],
)
def test_parse_bandwidth_errors(value, message):
    with pytest.raises(ValueError) as exc:
        parse_bandwidth(value)
    assert str(exc.value) == message


@given(st.integers(8, 10**13))
def test_bandwidth_round_trip(bits):
    text = format_bandwidth(bits)
    assert parse_bandwidth(text) == bits
    assert format_bandwidth(parse_bandwidth(text)) == text


@pytest.mark.parametrize(
    "text,size",
    [
        ("64kb", 65536),
        ("64k", 65536),
        ("1mb", 1048576),
        ("1500b", 1500),
        ("1500", 1500),
        (1500, 1500),
        ("8kbit", 1024),
        ("1gb", 1024**3),
    ],
)
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize(
    "value,message",
    [
        ("64kib", "bad size unit 'kib' in '64kib': expected b, kb, mb, gb (1024-based, as tc)"),
        (0, "size 0 must be positive"),
        ("big", "bad size 'big': expected a number and a unit, e.g. 64kb"),
    ],
)
def test_parse_size_errors(value, message):
    with pytest.raises(ValueError) as exc:
        parse_size(value)
    assert str(exc.value) == message


@given(st.integers(1, 2**40))
def test_size_round_trip(size):
    assert parse_size(format_size(size)) == size


@given(st.integers(1, 65535), st.integers(0, 1000))
def test_port_round_trip(first, span):
    last = min(65535, first + span)
    pr = PortRange(first, last)
    assert parse_port(str(pr)) == pr
    assert parse_port(pr.iptables) == pr


@pytest.mark.parametrize(
    "value,message",
    [
        (0, "port 0 is outside 1-65535"),
        (70000, "port 70000 is outside 1-65535"),
        ("9-3", "port range '9-3' is reversed: write '3-9'"),
        ("http", "bad port 'http': expected a number or a range like '8000-8100'"),
        (True, "port must be a number or a range like '8000-8100', got True"),
    ],
)
def test_port_errors(value, message):
    with pytest.raises(ValueError) as exc:
        parse_port(value)
    assert str(exc.value) == message
