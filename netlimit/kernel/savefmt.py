"""iptables-save text: split, parse, and spell canonically. Pure (no kernel, no subprocess).

`canon(spec, family)` predicts how `iptables-legacy-save` prints a rule spec
(the part after `-A CHAIN`). The kernel stores rules as binary blobs and
libxtables prints them back in its own spelling, which differs from what
render.py writes in a few places; both sides of a diff go through `canon`:

* hashlimit / limit rates are stored as a period (`scale * unit_seconds /
  count`, integer division) and printed in the finest unit whose quotient is
  not smaller than its remainder: `86400/day` comes back `1/sec`, `3/10s`
  (rendered `18/min`) stays `18/min`;
* `--hashlimit-htable-expire` is left out when it equals the printed unit in
  milliseconds (`5/min` with expire 60000), `--hashlimit-srcmask` /
  `--hashlimit-dstmask` when they cover the whole address, the gc interval at
  its default 1000, `--limit-burst` at its default 5;
* addresses (`-s`, `-d`, `recent --mask`) as inet_ntop prints them, with the
  mask applied; protocol numbers and aliases as names (`58`, `icmpv6` ->
  `ipv6-icmp`);
* values that were quoted come back double-quoted (comment, log prefix).

tests/kernel/test_restore_backend.py checks `canon(render line) == -save line`
for every rule in rules/*.yaml and a wide file of every match kind, IPv4 and
IPv6, against the real kernel.
"""

from __future__ import annotations

import ipaddress
import re
from functools import lru_cache

from .objects import Match

_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\S+')
_UNESC = re.compile(r"\\(.)")


def split(text: str) -> list[str]:
    """Raw tokens of a save line (a quoted value stays one token, quotes included)."""
    return _TOKEN.findall(text)


def unquote(tok: str) -> str:
    if len(tok) >= 2 and tok[0] == '"' and tok[-1] == '"':
        return _UNESC.sub(r"\1", tok[1:-1])
    return tok


def dquote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


# --- rates, as libxt_hashlimit / libxt_limit parse and print them ---------------------------

_UNITS = (("day", 86400), ("hour", 3600), ("min", 60), ("sec", 1))
_UNIT_WORDS = (("second", 1), ("minute", 60), ("hour", 3600), ("day", 86400))
HASHLIMIT_SCALE = 1_000_000  # XT_HASHLIMIT_SCALE_v2 (revisions 2 and 3)
LIMIT_SCALE = 10_000  # XT_LIMIT_SCALE


def _parse_rate(text: str, scale: int) -> tuple[int, int] | None:
    """'100/sec' -> (the period the kernel stores, the unit in seconds); None if not a plain packet rate."""
    count, _, unit = text.partition("/")
    if not count.isdigit() or int(count) == 0:
        return None
    mult = 1
    if unit:
        u = unit.lower()
        for word, m in _UNIT_WORDS:
            if word.startswith(u):
                mult = m
                break
        else:
            return None
    return scale * mult // int(count), mult


def _print_rate(period: int, scale: int) -> tuple[str, int]:
    """The spelling libxtables prints for a period, and that unit in ms (hashlimit's 'quantum')."""
    units = [(name, secs * scale) for name, secs in _UNITS]
    i = 1
    while i < len(units):
        m = units[i][1]
        if period > m or m // period < m % period:
            break
        i += 1
    name, mult = units[i - 1]
    return f"{mult // period}/{name}", mult // scale * 1000


# --- canonical spelling ------------------------------------------------------------------

_PROTO = {"1": "icmp", "6": "tcp", "17": "udp", "58": "ipv6-icmp", "icmpv6": "ipv6-icmp", "ipv6-icmp": "ipv6-icmp"}
_HASHLIMIT_ORDER = (
    "hashlimit-upto",
    "hashlimit-above",
    "hashlimit-burst",
    "hashlimit-mode",
    "hashlimit-name",
    "hashlimit-htable-size",
    "hashlimit-htable-max",
    "hashlimit-htable-gcinterval",
    "hashlimit-htable-expire",
    "hashlimit-srcmask",
    "hashlimit-dstmask",
)
_HL_MODES = ("srcip", "srcport", "dstip", "dstport")


def _net(value: str) -> str:
    try:
        return str(ipaddress.ip_network(value, strict=False))
    except ValueError:
        return value


def _addr(value: str) -> str:
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        return value


Option = list  # [negated: bool, name: str, values: list[str]]  (values are raw tokens)


def _options(toks: list[str], i: int) -> tuple[list[Option], int]:
    """Options ('--name value...', maybe preceded by '!') up to the next -m/-j/-g."""
    out: list[Option] = []
    neg = False
    while i < len(toks):
        t = toks[i]
        if t in ("-m", "-j", "-g", "--match", "--jump", "--goto"):
            break
        if t == "!":
            neg = True
            i += 1
            continue
        if t.startswith("--"):
            out.append([neg, t[2:], []])
            neg = False
        elif out:
            out[-1][2].append(t)
        else:  # a stray value: keep it verbatim
            out.append([neg, "", [t]])
            neg = False
        i += 1
    return out, i


def _val(opt: Option) -> str:
    return unquote(opt[2][0]) if opt[2] else ""


def _canon_hashlimit(opts: list[Option], family: int) -> list[Option]:
    d = {o[1]: o for o in opts}
    quantum = None
    for key in ("hashlimit-above", "hashlimit-upto", "hashlimit"):
        o = d.get(key)
        if o is not None and o[2]:
            parsed = _parse_rate(_val(o), HASHLIMIT_SCALE)
            if parsed:
                spelt, quantum = _print_rate(parsed[0], HASHLIMIT_SCALE)
                o[2] = [spelt]
                if "hashlimit-htable-expire" not in d:
                    # iptables' default expire is the unit *written*, in ms; it prints
                    # expire whenever that differs from the unit it prints
                    o_exp: Option = [False, "hashlimit-htable-expire", [str(parsed[1] * 1000)]]
                    opts = opts + [o_exp]
                    d[o_exp[1]] = o_exp
            if key == "hashlimit":  # the old alias of --hashlimit-upto
                o[1] = "hashlimit-upto"
    mode = d.get("hashlimit-mode")
    if mode is not None and mode[2]:
        parts = _val(mode).split(",")
        mode[2] = [",".join(sorted(parts, key=lambda p: _HL_MODES.index(p) if p in _HL_MODES else 9))]
    full = "32" if family == 4 else "128"
    drop = set()
    for key in ("hashlimit-srcmask", "hashlimit-dstmask"):
        if key in d and _val(d[key]) == full:
            drop.add(key)
    if "hashlimit-htable-gcinterval" in d and _val(d["hashlimit-htable-gcinterval"]) == "1000":
        drop.add("hashlimit-htable-gcinterval")
    if quantum is not None and "hashlimit-htable-expire" in d and _val(d["hashlimit-htable-expire"]) == str(quantum):
        drop.add("hashlimit-htable-expire")
    kept = [o for o in opts if o[1] not in drop]
    order = {k: n for n, k in enumerate(_HASHLIMIT_ORDER)}
    return sorted(kept, key=lambda o: order.get(o[1], len(order)))


def _canon_limit(opts: list[Option], family: int) -> list[Option]:
    out = []
    for o in opts:
        if o[1] == "limit" and o[2]:
            parsed = _parse_rate(_val(o), LIMIT_SCALE)
            if parsed:
                o[2] = [_print_rate(parsed[0], LIMIT_SCALE)[0]]
        if o[1] == "limit-burst" and _val(o) == "5":
            continue
        out.append(o)
    return out


def _canon_recent(opts: list[Option], family: int) -> list[Option]:
    for o in opts:
        if o[1] == "mask" and o[2]:
            o[2] = [_addr(_val(o))]
    return opts


_MODULES = {"hashlimit": _canon_hashlimit, "limit": _canon_limit, "recent": _canon_recent}


def _emit(opts: list[Option]) -> list[str]:
    out: list[str] = []
    for neg, name, vals in opts:
        if neg:
            out.append("!")
        if name:
            out.append("--" + name)
        out.extend(dquote(unquote(v)) if v.startswith('"') else v for v in vals)
    return out


_MARKS = frozenset(("-m", "-j", "-g", "--match", "--jump", "--goto"))
_HEAD = {"-s": "-s", "--source": "-s", "-d": "-d", "--destination": "-d", "-p": "-p", "--protocol": "-p"}


@lru_cache(maxsize=4096)
def _net_c(value: str) -> str:
    return _net(value)


@lru_cache(maxsize=1 << 16)
def canon(spec: str, family: int) -> str:
    """The rule spec as iptables-save prints it (see the module docstring). Only what
    libxtables respells is rewritten; every other token is kept as it is."""
    toks = split(spec)
    n = len(toks)
    marks = [i for i, t in enumerate(toks) if t in _MARKS]
    head_end = marks[0] if marks else n
    out: list[str] = []
    i = 0
    while i < head_end:  # addresses, interfaces, protocol
        t = toks[i]
        h = _HEAD.get(t)
        if h is not None and i + 1 < head_end:
            v = toks[i + 1]
            if h == "-p":
                v = v.lower()
                v = _PROTO.get(v, v)
            else:
                v = _net_c(v)
            out += [h, v]
            i += 2
        else:
            out.append(t)
            i += 1
    marks.append(n)
    for k in range(len(marks) - 1):
        a, b = marks[k], marks[k + 1]
        t = toks[a]
        if t in ("-m", "--match") and a + 1 < b:
            mod = toks[a + 1]
            fix = _MODULES.get(mod)
            if fix is None:
                out.append("-m")
                out.extend(toks[a + 1 : b])
            else:
                opts, _ = _options(toks[:b], a + 2)
                out += ["-m", mod] + _emit(fix(opts, family))
        elif t in ("--jump", "--goto"):
            out.append("-j" if t == "--jump" else "-g")
            out.extend(toks[a + 1 : b])
        else:
            out.extend(toks[a:b])
    return " ".join(out)


# --- save lines -> IptRule parts ------------------------------------------------------------


def parse_spec(spec: str) -> dict:
    """A save-format rule spec as IptRule keyword arguments (src, dst, in_iface, protocol,
    comment, matches, target, target_options). The first comment match becomes `comment`."""
    toks = split(spec)
    kw: dict = {
        "src": None,
        "dst": None,
        "in_iface": None,
        "protocol": None,
        "comment": "",
        "target": None,
        "target_options": (),
    }
    matches: list[Match] = []
    i, n = 0, len(toks)
    while i < n and toks[i] not in ("-m", "-j", "-g"):
        t = toks[i]
        if i + 1 < n and t in ("-s", "-d", "-i", "-p"):
            kw[{"-s": "src", "-d": "dst", "-i": "in_iface", "-p": "protocol"}[t]] = toks[i + 1]
            i += 2
        else:
            i += 1
    while i < n:
        t = toks[i]
        if t == "-m" and i + 1 < n:
            mod = toks[i + 1]
            opts, i = _options(toks, i + 2)
            pairs = tuple((name, " ".join(unquote(v) for v in vals) if vals else None) for _neg, name, vals in opts)
            if mod == "comment" and not kw["comment"] and pairs and pairs[0][0] == "comment":
                kw["comment"] = pairs[0][1] or ""
            else:
                matches.append(Match(mod, pairs))
        elif t in ("-j", "-g") and i + 1 < n:
            kw["target"] = toks[i + 1]
            opts, i = _options(toks, i + 2)
            kw["target_options"] = tuple(
                (name, " ".join(unquote(v) for v in vals) if vals else None) for _neg, name, vals in opts
            )
        else:
            i += 1
    kw["matches"] = tuple(matches)
    return kw
