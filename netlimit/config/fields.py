"""The config's field types: each parsed on input into a canonical type, written
back as the file writes it, with its JSON Schema (network, rate, port, bandwidth,
size, duration, comment).  Their users import them from :mod:`netlimit.config.model`
too (it re-exports them).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

from .units import (
    PortRange,
    Rate,
    format_bandwidth,
    format_duration,
    format_size,
    parse_bandwidth,
    parse_duration,
    parse_port,
    parse_rate,
    parse_size,
)

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,47}$")


def _parse_network(value: object) -> IPNetwork:
    if isinstance(value, (ipaddress.IPv4Network, ipaddress.IPv6Network)):
        return value
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected an address or CIDR like '10.0.0.0/8' or '2001:db8::/32', got {value!r}")
    try:
        return ipaddress.ip_network(value.strip(), strict=True)
    except ValueError:
        try:
            net = ipaddress.ip_network(value.strip(), strict=False)
        except ValueError:
            raise ValueError(f"{value!r} is not an IP address or CIDR network") from None
        raise ValueError(f"{value!r} has host bits set: did you mean '{net}'?") from None


def _ser_str(v: Any) -> str:
    return str(v)


CIDR = Annotated[
    IPNetwork,
    BeforeValidator(_parse_network),
    PlainSerializer(_ser_str, return_type=str),
    WithJsonSchema({"type": "string", "description": "IPv4 or IPv6 address or CIDR, e.g. 10.0.0.0/8"}),
]
RateT = Annotated[
    Rate,
    BeforeValidator(parse_rate),
    PlainSerializer(_ser_str, return_type=str),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": r"^\s*\d+\s*/\s*(\d+)?\s*(s|sec|secs?|seconds?|m|mins?|minutes?|h|hr|hours?|d|days?)\s*$",
            "description": "N/second|minute|hour|day, also 100/s, 6/m, 3/10s",
            "examples": ["100/second", "3/minute"],
        }
    ),
]
PortT = Annotated[
    PortRange,
    BeforeValidator(parse_port),
    PlainSerializer(_ser_str, return_type=str),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 1, "maximum": 65535},
                {"type": "string", "pattern": r"^\d+(-\d+)?$"},
            ],
            "description": "a port or a range '8000-8100'",
        }
    ),
]
BandwidthT = Annotated[
    int,
    BeforeValidator(parse_bandwidth),
    PlainSerializer(format_bandwidth, return_type=str),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": r"^\d+(\.\d+)?\s*(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)$",
            "description": "bits/s as tc writes them: 10mbit (bps = bytes/s)",
            "examples": ["10mbit"],
        }
    ),
]
SizeT = Annotated[
    int,
    BeforeValidator(parse_size),
    PlainSerializer(format_size, return_type=str),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 1},
                {"type": "string", "pattern": r"^\d+(\.\d+)?\s*(b|k|kb|m|mb|g|gb|kbit|mbit|gbit)?$"},
            ],
            "description": "bytes as tc writes them: 64kb (1024-based)",
        }
    ),
]


DurationT = Annotated[
    int,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 1},
                {
                    "type": "string",
                    "pattern": r"^\s*\d+\s*(s|sec|secs?|seconds?|m|mins?|minutes?|h|hr|hours?|d|days?)?\s*$",
                },
            ],
            "description": "seconds, or 30s, 15m, 1h, 2d",
            "examples": ["1m", "15m"],
        }
    ),
]


#: a rule's `comment:` -- it goes into nft/iptables comments (nft allows 128 bytes in all,
#: "netlimit:<48-character name> #<12-hex tag>" takes 71): printable ASCII, no quote or backslash
COMMENT_MAX = 48
_COMMENT_RE = re.compile(r"^[ !#-\[\]-~]+$")


def _check_comment(v: object) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ValueError(f"comment must be text, got {v!r}")
    v = v.strip()
    if len(v) > COMMENT_MAX:
        raise ValueError(f"comment is {len(v)} characters; at most {COMMENT_MAX} fit in a kernel rule's comment")
    if not _COMMENT_RE.match(v):
        raise ValueError(f"comment {v!r}: printable ASCII only, without '\"' or '\\' (it is quoted in nft/iptables)")
    return v


CommentT = Annotated[
    str,
    BeforeValidator(_check_comment),
    WithJsonSchema(
        {
            "type": "string",
            "maxLength": COMMENT_MAX,
            "pattern": _COMMENT_RE.pattern,
            "description": "up to 48 printable ASCII characters, no double quote or backslash",
        }
    ),
]
