"""Units of the config file: rates ("100/s"), bandwidths ("10mbit"), sizes ("64kb").

Every parser accepts what an operator types and raises ValueError with a message
that says what was expected; every value has a canonical text form so that
parse(format(x)) == x (checked by property tests).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# --- rates: N/unit -----------------------------------------------------------

RATE_UNITS: dict[str, int] = {
    "second": 1,
    "minute": 60,
    "hour": 3600,
    "day": 86400,
}
_RATE_ALIASES: dict[str, str] = {
    "s": "second",
    "sec": "second",
    "secs": "second",
    "second": "second",
    "seconds": "second",
    "m": "minute",
    "min": "minute",
    "mins": "minute",
    "minute": "minute",
    "minutes": "minute",
    "h": "hour",
    "hr": "hour",
    "hour": "hour",
    "hours": "hour",
    "d": "day",
    "day": "day",
    "days": "day",
}
_RATE_RE = re.compile(r"^\s*(\d+)\s*/\s*(\d+)?\s*([A-Za-z]+)\s*$")
_UNIT_SHORT = {"second": "s", "minute": "m", "hour": "h", "day": "d"}


@dataclass(frozen=True, slots=True)
class Rate:
    """`count` events per `every` × `unit` (second|minute|hour|day): 3/minute, 3/10s."""

    count: int
    unit: str
    every: int = 1

    @property
    def period(self) -> int:
        """Seconds in one period."""
        return self.every * RATE_UNITS[self.unit]

    @property
    def per_second(self) -> float:
        return self.count / self.period

    def exact(self) -> tuple[int, str] | None:
        """The same rate as N per second|minute|hour|day with a whole N (what
        hashlimit can express), preferring the smallest unit; None if none fits."""
        if self.every == 1:
            return (self.count, self.unit)
        for unit, secs in RATE_UNITS.items():
            n, rem = divmod(self.count * secs, self.period)
            if rem == 0 and n > 0:
                return (n, unit)
        return None

    def __str__(self) -> str:
        if self.every == 1:
            return f"{self.count}/{self.unit}"
        return f"{self.count}/{self.every}{_UNIT_SHORT[self.unit]}"


def parse_rate(text: object) -> Rate:
    if isinstance(text, Rate):
        return text
    if not isinstance(text, str):
        raise ValueError(f"rate must be text like '100/second', got {text!r}")
    m = _RATE_RE.match(text)
    if not m:
        raise ValueError(f"bad rate {text!r}: expected N/second|minute|hour|day (also 100/s, 6/m, 3/10s)")
    count, unit = int(m.group(1)), m.group(3).lower()
    every = int(m.group(2)) if m.group(2) is not None else 1
    if unit not in _RATE_ALIASES:
        raise ValueError(f"bad rate unit {m.group(3)!r} in {text!r}: expected second, minute, hour or day (s, m, h, d)")
    if count <= 0:
        raise ValueError(f"rate {text!r} must be at least 1 per period")
    if every <= 0:
        raise ValueError(f"rate {text!r}: the period must be at least 1 {_RATE_ALIASES[unit]}")
    return Rate(count, _RATE_ALIASES[unit], every)


def format_rate(rate: Rate) -> str:
    return str(rate)


# --- bandwidth: bits per second, tc's units ------------------------------------

# tc(8): bit, kbit, mbit, gbit, tbit are bits/s with SI multipliers; bps, kbps,
# mbps, gbps, tbps are BYTES/s. We follow tc exactly so values can be pasted.
_BW_UNITS: dict[str, int] = {
    "bit": 1,
    "kbit": 10**3,
    "mbit": 10**6,
    "gbit": 10**9,
    "tbit": 10**12,
    "bps": 8,
    "kbps": 8 * 10**3,
    "mbps": 8 * 10**6,
    "gbps": 8 * 10**9,
    "tbps": 8 * 10**12,
}
_NUM_UNIT_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_bandwidth(text: object) -> int:
    """Return bits per second."""
    if isinstance(text, bool):
        raise ValueError(f"bandwidth must be text like '10mbit', got {text!r}")
    if isinstance(text, int):
        raise ValueError(
            f"bandwidth {text} has no unit: write e.g. '{text}mbit' (bit, kbit, mbit, gbit; bps = bytes/s)"
        )
    if not isinstance(text, str):
        raise ValueError(f"bandwidth must be text like '10mbit', got {text!r}")
    m = _NUM_UNIT_RE.match(text)
    if not m:
        raise ValueError(f"bad bandwidth {text!r}: expected a number and a unit, e.g. 10mbit")
    unit = m.group(2).lower()
    if not unit:
        raise ValueError(
            f"bandwidth {text!r} has no unit: write e.g. '{m.group(1)}mbit' (bit, kbit, mbit, gbit; bps = bytes/s)"
        )
    if unit not in _BW_UNITS:
        raise ValueError(
            f"bad bandwidth unit {m.group(2)!r} in {text!r}: expected bit, kbit, mbit, gbit, tbit "
            "(or bps, kbps, mbps, gbps for bytes/s)"
        )
    value = float(m.group(1)) * _BW_UNITS[unit]
    bits = int(round(value))
    if bits < 8:
        raise ValueError(f"bandwidth {text!r} is below 8 bit/s")
    return bits


def format_bandwidth(bits: int) -> str:
    """Canonical, exact text for a bit rate (largest unit that divides it)."""
    for unit in ("tbit", "gbit", "mbit", "kbit"):
        mult = _BW_UNITS[unit]
        if bits % mult == 0:
            return f"{bits // mult}{unit}"
    return f"{bits}bit"


# --- sizes: bytes, tc's units -------------------------------------------------

# tc(8): b = bytes, k/kb = 1024 bytes, m/mb = 1024 kb, g/gb = 1024 mb;
# kbit/mbit/gbit are bits. We follow tc.
_SIZE_UNITS: dict[str, float] = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1024,
    "m": 1024**2,
    "mb": 1024**2,
    "g": 1024**3,
    "gb": 1024**3,
    "kbit": 1024 / 8,
    "mbit": 1024**2 / 8,
    "gbit": 1024**3 / 8,
}


def parse_size(text: object) -> int:
    """Return bytes."""
    if isinstance(text, bool):
        raise ValueError(f"size must be like '64kb', got {text!r}")
    if isinstance(text, int):
        if text <= 0:
            raise ValueError(f"size {text} must be positive")
        return text
    if not isinstance(text, str):
        raise ValueError(f"size must be like '64kb', got {text!r}")
    m = _NUM_UNIT_RE.match(text)
    if not m:
        raise ValueError(f"bad size {text!r}: expected a number and a unit, e.g. 64kb")
    unit = m.group(2).lower()
    if unit not in _SIZE_UNITS:
        raise ValueError(f"bad size unit {m.group(2)!r} in {text!r}: expected b, kb, mb, gb (1024-based, as tc)")
    size = int(round(float(m.group(1)) * _SIZE_UNITS[unit]))
    if size <= 0:
        raise ValueError(f"size {text!r} must be positive")
    return size


def format_size(size: int) -> str:
    for unit, mult in (("gb", 1024**3), ("mb", 1024**2), ("kb", 1024)):
        if size % mult == 0:
            return f"{size // mult}{unit}"
    return f"{size}b"


# --- ports ------------------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class PortRange:
    first: int
    last: int

    def __str__(self) -> str:
        return str(self.first) if self.first == self.last else f"{self.first}-{self.last}"

    @property
    def iptables(self) -> str:
        """iptables spelling (multiport uses ':' for ranges)."""
        return str(self.first) if self.first == self.last else f"{self.first}:{self.last}"


def parse_port(value: object) -> PortRange:
    if isinstance(value, PortRange):
        return value
    if isinstance(value, bool):
        raise ValueError(f"port must be a number or a range like '8000-8100', got {value!r}")
    if isinstance(value, int):
        first = last = value
    elif isinstance(value, str):
        m = re.match(r"^\s*(\d+)\s*(?:[-:]\s*(\d+))?\s*$", value)
        if not m:
            raise ValueError(f"bad port {value!r}: expected a number or a range like '8000-8100'")
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) else first
    else:
        raise ValueError(f"port must be a number or a range like '8000-8100', got {value!r}")
    for p in (first, last):
        if not 1 <= p <= 65535:
            raise ValueError(f"port {p} is outside 1-65535")
    if last < first:
        raise ValueError(f"port range {value!r} is reversed: write '{last}-{first}'")
    return PortRange(first, last)


# --- durations: 30s, 15m, 1h, 2d ---------------------------------------------------

_DURATION_RE = re.compile(r"^\s*(\d+)\s*([A-Za-z]*)\s*$")


def parse_duration(value: object) -> int:
    """Whole seconds from '30s', '15m', '1h', '2d' (the rate units: s, m, h, d and their
    long names) or a bare number of seconds."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like '30s', '15m', '1h' or '2d', got {value!r}")
    if isinstance(value, int):
        n, unit = value, "second"
    elif isinstance(value, str) and (m := _DURATION_RE.match(value)):
        n = int(m.group(1))
        word = m.group(2).lower() or "s"
        if word not in _RATE_ALIASES:
            raise ValueError(f"bad duration unit {m.group(2)!r} in {value!r}: expected s, m, h or d")
        unit = _RATE_ALIASES[word]
    else:
        raise ValueError(f"expected a duration like '30s', '15m', '1h' or '2d', got {value!r}")
    if n <= 0:
        raise ValueError(f"duration {value!r} must be at least 1 second")
    return n * RATE_UNITS[unit]


def format_duration(seconds: float) -> str:
    """The shortest exact spelling: 900 -> '15m', 90 -> '90s', 86400 -> '1d'
    (a fraction of a second is rounded up: a time left is never shown as 0)."""
    s = max(1, int(-(-seconds // 1)))
    for unit, secs in (("d", 86400), ("h", 3600), ("m", 60)):
        if s % secs == 0:
            return f"{s // secs}{unit}"
    return f"{s}s"


def format_left(seconds: float) -> str:
    """A time left for people: '14m03s', '2h05m', '3d04h', '45s'."""
    s = max(0, int(seconds))
    if s >= 86400:
        return f"{s // 86400}d{s % 86400 // 3600:02d}h"
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"
