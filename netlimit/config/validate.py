"""Load + validate a netlimit file: every problem as FILE:LINE:COL: RULE: MESSAGE.

Three passes, each reporting all it finds:
1. YAML syntax and duplicate keys (loader.py);
2. shape and types (pydantic models, errors mapped back to line/column, with
   did-you-mean for unknown fields);
3. meaning: duplicate names, limits this kernel cannot honour, and the checks
   envoyproxy/ratelimit makes of its config (duplicate descriptors, ``replaces``
   naming its own descriptor, ``share_threshold`` without a wildcard, ...), with
   Lyft's messages -- for the ``http:`` section and for every file of its
   ``lyft_config_dir`` alike, so ``netlimit validate`` and the sidecar refuse
   the same files.
"""

from __future__ import annotations

import difflib
import hashlib
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path as FsPath
from typing import Any

from pydantic import BaseModel, ValidationError

from ..errors import ConfigError
from . import kernel_limits as kl
from .loader import Document, Problem, YamlError, load_text
from .model import (
    BandwidthRule,
    BansConfig,
    Config,
    Descriptor,
    Escalate,
    HttpConfig,
    LyftFile,
    NetworkRule,
    RateLimit,
    Replaces,
)
from .units import Rate

MAX_FILE_BYTES = 1024 * 1024
#: at most this many files in a lyft_config_dir
MAX_LYFT_FILES = 1000
#: a label for problems in a Lyft config file (its "rule" column)
LYFT = "lyft"


@dataclass
class LyftLoaded:
    """One valid file of ``http.lyft_config_dir``: a domain and its descriptors."""

    config: LyftFile
    path: str
    text: str
    doc: Document = field(repr=False)

    def position(self, *path: Any) -> tuple[int, int]:
        return self.doc.pos(path)


@dataclass
class Loaded:
    """A valid config with where it came from (for hashes and messages)."""

    config: Config
    path: str
    text: str
    doc: Document = field(repr=False)
    warnings: list[Problem] = field(default_factory=list)
    #: the files of http.lyft_config_dir, by name
    lyft: list[LyftLoaded] = field(default_factory=list)
    #: the files of `include:`, (path, text) in the order merged
    included: list[tuple[str, str]] = field(default_factory=list)
    #: with `include:`: turns positions in `doc` back into FILE:LINE (include.Includes)
    includes: Any = field(default=None, repr=False)

    @property
    def sha256(self) -> str:
        """The file's hash; with a lyft_config_dir, of the file and every file of the directory;
        with `include:`, of every included file too."""
        h = hashlib.sha256(self.text.encode())
        for lf in self.lyft:
            h.update(b"\0" + lf.path.encode("utf-8", "surrogateescape") + b"\0" + lf.text.encode())
        for path, text in self.included:
            h.update(b"\0include\0" + path.encode("utf-8", "surrogateescape") + b"\0" + text.encode())
        return h.hexdigest()

    def decode(self, problems: list[Problem]) -> list[Problem]:
        """Problems made from ``doc`` positions with the file they are in (``include:``)."""
        return self.includes.decode(problems) if self.includes is not None else problems

    def position(self, *path: Any) -> tuple[int, int]:
        return self.doc.pos(path)


def load_file(path: str | FsPath) -> Loaded:
    """Read and validate a file. Raises ConfigError (never anything else for bad input)."""
    return load_string(_read_text(path), str(path))


def _read_text(path: str | FsPath) -> str:
    """A config file's text; ConfigError when it cannot be read or is not UTF-8 text."""
    name = str(path)
    try:
        # never more than the cap in memory: a 50 MB file (or /dev/zero) is
        # refused after reading MAX_FILE_BYTES + 1 bytes at most
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_FILE_BYTES:
                raise ConfigError([Problem(name, 1, 1, "file", f"file is {size} bytes; the limit is {MAX_FILE_BYTES}")])
            raw = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError([Problem(name, 0, 0, "file", "no such file")]) from None
    except IsADirectoryError:
        raise ConfigError([Problem(name, 0, 0, "file", "is a directory, expected a YAML file")]) from None
    except OSError as exc:
        raise ConfigError([Problem(name, 0, 0, "file", f"cannot read: {exc.strerror}")]) from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError([Problem(name, 1, 1, "file", f"file is over {MAX_FILE_BYTES} bytes, the limit")])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError([Problem(name, 1, 1, "file", f"not UTF-8 text (byte {exc.start})")]) from None
    return text


def load_string(text: str, filename: str = "<string>") -> Loaded:
    try:
        doc = load_text(text, filename)
    except YamlError as exc:
        raise ConfigError(exc.problems) from None
    if isinstance(doc.data, dict) and "include" in doc.data:
        return _with_includes(text, doc, filename)
    return _validated(text, doc, filename)


def _with_includes(text: str, doc: Document, filename: str) -> Loaded:
    """The file and its ``include:`` files validated as one (include.py); every
    problem and warning with the file it is in."""
    from .include import merge

    merged, inc = merge(doc, filename, _read_text)
    try:
        loaded = _validated(text, merged, filename)
    except ConfigError as exc:
        raise ConfigError(inc.decode(exc.problems)) from None
    loaded.warnings = inc.decode(loaded.warnings)
    loaded.included = list(zip(inc.files[1:], inc.texts))
    loaded.includes = inc
    return loaded


def _validated(text: str, doc: Document, filename: str) -> Loaded:
    if doc.data is None:
        raise ConfigError([Problem(filename, 1, 1, "file", "the file is empty: start with 'version: 1'")])
    if not isinstance(doc.data, dict):
        line, col = doc.pos(())
        raise ConfigError(
            [
                Problem(
                    filename,
                    line,
                    col,
                    "file",
                    "the file must be a mapping with 'version: 1' and sections network / bandwidth / http",
                )
            ]
        )
    problems: list[Problem] = []
    if isinstance(doc.data.get("http"), dict):
        _lyft_text(doc.data["http"], doc, ("http",))
    try:
        config = Config.model_validate(doc.data)
    except ValidationError as exc:
        problems.extend(_map_errors(exc, doc, filename))
        problems.sort(key=lambda p: (p.line, p.col))
        raise ConfigError(problems) from None
    warnings: list[Problem] = []
    problems.extend(_semantic(config, doc, filename, warnings))
    lyft: list[LyftLoaded] = []
    if config.http is not None:
        http = config.http
        problems.extend(_http_semantic(http.descriptors, http.domain, doc, filename, ("http",), "http"))
        if not http.domain and not http.lyft_config_dir:
            line, col = doc.pos(("http",), key=True)
            msg = (
                "config file cannot have empty domain: set http.domain (or http.lyft_config_dir, a directory "
                "of Lyft config files, one domain each)"
            )
            problems.append(Problem(filename, line, col, "http", msg))
    problems.sort(key=lambda p: (p.line, p.col))
    if config.http is not None and config.http.lyft_config_dir and not problems:
        lyft, more = load_lyft_dir(
            config.http.lyft_config_dir, filename, doc, config.http.domain, config.http.merge_domains
        )
        problems.extend(more)
    if problems:
        raise ConfigError(problems)
    return Loaded(config=config, path=filename, text=text, doc=doc, warnings=warnings, lyft=lyft)


# --- Lyft's config: text as written, a directory of files, Lyft's own checks -------


def _lyft_text(node: Any, doc: Document, path: tuple[Any, ...]) -> None:
    """Give the Lyft text fields (domain, key, value, names) of ``node`` -- an
    ``http:`` section or a Lyft file -- the text written in the file where YAML
    read something else (``value: 1.10`` is "1.10" to Lyft, not 1.1; ``NO`` is
    "NO", not false).  Null stays null (no value).  Changes ``node`` in place."""

    def text(d: dict[Any, Any], where: tuple[Any, ...], name: str) -> None:
        v = d.get(name)
        if v is not None and not isinstance(v, str):
            t = doc.text.get(where + (name,))
            if t is not None:
                d[name] = t

    def walk(descs: Any, where: tuple[Any, ...], depth: int) -> None:
        if not isinstance(descs, list) or depth > 64:
            return
        for i, d in enumerate(descs):
            if not isinstance(d, dict):
                continue
            here = where + (i,)
            text(d, here, "key")
            text(d, here, "value")
            rl = d.get("rate_limit")
            if isinstance(rl, dict):
                text(rl, here + ("rate_limit",), "name")
                for j, r in enumerate(rl.get("replaces") or ()):
                    if isinstance(r, dict):
                        text(r, here + ("rate_limit", "replaces", j), "name")
            for j, r in enumerate(d.get("replaces") or ()):
                if isinstance(r, dict):
                    text(r, here + ("replaces", j), "name")
            walk(d.get("descriptors"), here + ("descriptors",), depth + 1)

    if isinstance(node, dict):
        text(node, path, "domain")
        walk(node.get("descriptors"), path + ("descriptors",), 0)


def _composite(d: Descriptor) -> str:
    """Lyft's name of a descriptor at its level: ``key_value``, or ``key`` without a value."""
    return f"{d.key}_{d.value}" if d.value else d.key


def _http_semantic(
    descriptors: Sequence[Descriptor], domain: str, doc: Document, filename: str, base: tuple[Any, ...], label: str
) -> list[Problem]:
    """envoyproxy/ratelimit's checks of a descriptor tree (config_impl.go
    ``loadDescriptors``), with its messages, and netlimit's own."""
    out: list[Problem] = []

    def add(path: tuple[Any, ...], message: str, *, key: bool = False) -> None:
        line, col = doc.pos(path, key=key)
        out.append(Problem(filename, line, col, label, message))

    def walk(descs: Sequence[Descriptor], where: tuple[Any, ...], parent: str, depth: int) -> None:
        seen: dict[str, int] = {}
        for i, d in enumerate(descs):
            here = where + ("descriptors", i)
            if not d.key:
                add(here + ("key",) if "key" in _raw(doc, here) else here, "descriptor has empty key")
                continue
            final = _composite(d)
            full = parent + final
            if final in seen:
                first = doc.pos(where + ("descriptors", seen[final], "key"))[0]
                add(here + ("key",), f"duplicate descriptor composite key '{full}' (first at line {first})")
            else:
                seen[final] = i
            rl = d.rate_limit
            for j, r in enumerate(d.replaces):
                where_r = _replaces_path(doc, here, j, len(d.replaces))
                if not r.name:
                    add(where_r, "should not have an empty replaces entry")
                elif rl is not None and r.name == rl.name:
                    add(where_r, "replaces should not contain name of same descriptor")
            if d.share_threshold and "*" not in final:
                add(
                    here + ("share_threshold",),
                    f"share_threshold can only be used with wildcard values (containing '*'), but found key '{final}'",
                )
            if d.shadow_mode and rl is None and not d.unlimited and not d.descriptors:
                add(here + ("shadow_mode",), "shadow_mode on a descriptor without rate_limit does nothing")
            if d.quota_mode and rl is None and not d.unlimited and not d.descriptors:
                add(here + ("quota_mode",), "quota_mode on a descriptor without rate_limit does nothing")
            if d.metadata is not None:
                bad = _metadata_problem(d.metadata)
                if bad:
                    add(here + ("metadata",), f"error parsing metadata: {bad}")
            if depth < 64:
                walk(d.descriptors, here, full + ".", depth + 1)

    walk(descriptors, base, f"{domain}.", 0)
    return out


def _raw(doc: Document, path: tuple[Any, ...]) -> dict[Any, Any]:
    """The mapping the file has at ``path`` ({} if none)."""
    node = doc.data
    for p in path:
        try:
            node = node[p]
        except (KeyError, IndexError, TypeError):
            return {}
    return node if isinstance(node, dict) else {}


def _replaces_path(doc: Document, here: tuple[Any, ...], j: int, n: int) -> tuple[Any, ...]:
    """Where replaces entry ``j`` (of ``n``, Lyft's inside rate_limit first) is written."""
    raw = _raw(doc, here)
    inner = raw.get("rate_limit", {}).get("replaces") if isinstance(raw.get("rate_limit"), dict) else None
    own = raw.get("replaces")
    own_n = len(own) if isinstance(own, list) else 0
    if own_n and j < own_n:
        return here + ("replaces", j, "name")
    if isinstance(inner, list):
        return here + ("rate_limit", "replaces", j - own_n, "name")
    return here + ("replaces", j, "name")


def _metadata_problem(value: Any, depth: int = 0) -> str | None:
    """What keeps ``value`` from being a protobuf Struct (Lyft's parseMetadata), or None."""
    if depth > 32:
        return "nested too deeply"
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, (str, int, float, bool)):
                return f"key {k!r} is not text"
            bad = _metadata_problem(v, depth + 1)
            if bad:
                return bad
        return None
    if isinstance(value, list):
        for v in value:
            bad = _metadata_problem(v, depth + 1)
            if bad:
                return bad
        return None
    if value is None or isinstance(value, (str, int, float, bool)):
        return None
    return f"invalid type: {type(value).__name__} ({value!r:.40})"


def lyft_dir_path(config_path: str, directory: str) -> FsPath:
    """``http.lyft_config_dir`` as a path: relative to the config file's directory."""
    d = FsPath(directory)
    return d if d.is_absolute() else FsPath(config_path).parent / d


def load_lyft_dir(
    directory: str, config_path: str, doc: Document | None = None, main_domain: str = "", merge: bool = False
) -> tuple[list[LyftLoaded], list[Problem]]:
    """Every ``*.yaml`` / ``*.yml`` file of ``directory`` (relative to the config
    file's directory; dot files are skipped), each in Lyft's format, as
    envoyproxy/ratelimit loads its runtime directory.  A domain in two files is
    refused, as Lyft does -- unless ``merge`` (Lyft's MERGE_DOMAIN_CONFIG): then
    their descriptors are one tree, and a descriptor in two of them is refused.
    A file's domain may not be http.domain's."""
    where = lyft_dir_path(config_path, directory)
    line, col = doc.pos(("http", "lyft_config_dir")) if doc is not None else (0, 0)
    try:
        names = sorted(
            e.name
            for e in os.scandir(where)
            if not e.name.startswith(".") and e.name.endswith((".yaml", ".yml")) and e.is_file()
        )
    except FileNotFoundError:
        return [], [Problem(config_path, line, col, "http", f"lyft_config_dir {str(where)!r}: no such directory")]
    except NotADirectoryError:
        return [], [Problem(config_path, line, col, "http", f"lyft_config_dir {str(where)!r} is not a directory")]
    except OSError as exc:
        return [], [Problem(config_path, line, col, "http", f"lyft_config_dir {str(where)!r}: {exc.strerror}")]
    if len(names) > MAX_LYFT_FILES:
        return [], [
            Problem(
                config_path,
                line,
                col,
                "http",
                f"lyft_config_dir {str(where)!r} holds {len(names)} config files; at most {MAX_LYFT_FILES}",
            )
        ]
    out: list[LyftLoaded] = []
    problems: list[Problem] = []
    domains: dict[str, tuple[str, int]] = {}
    tops: dict[str, dict[str, tuple[str, int]]] = {}  # merged domains: their top-level descriptors
    for name in names:
        path = str(where / name)
        try:
            lf = load_lyft_string(_read_text(path), path)
        except ConfigError as exc:
            problems.extend(exc.problems)
            continue
        d = lf.config.domain
        ln, cl = lf.position("domain")
        if d == main_domain:
            msg = f"duplicate domain '{d}' in config file (also http.domain of {config_path})"
            problems.append(Problem(path, ln, cl, LYFT, msg))
            continue
        if d in domains and not merge:
            f0, l0 = domains[d]
            problems.append(Problem(path, ln, cl, LYFT, f"duplicate domain '{d}' in config file (also in {f0}:{l0})"))
            continue
        domains.setdefault(d, (path, ln))
        seen = tops.setdefault(d, {})
        bad = False
        for i, desc in enumerate(lf.config.descriptors):
            final = _composite(desc)
            dl = lf.position("descriptors", i, "key")
            if final in seen:
                f0, l0 = seen[final]
                problems.append(
                    Problem(path, *dl, LYFT, f"duplicate descriptor composite key '{d}.{final}' (first in {f0}:{l0})")
                )
                bad = True
            else:
                seen[final] = (path, dl[0])
        if not bad:
            out.append(lf)
    return out, problems


def load_lyft_string(text: str, filename: str) -> LyftLoaded:
    """One envoyproxy/ratelimit config file (``domain:`` and ``descriptors:``), as
    Lyft reads it (a leading ``---`` is fine), checked as Lyft checks it.
    Raises ConfigError."""
    try:
        doc = load_text(text, filename)
    except YamlError as exc:
        raise ConfigError(exc.problems) from None
    if doc.data is None:
        doc.data = {}
    if not isinstance(doc.data, dict):
        line, col = doc.pos(())
        raise ConfigError(
            [Problem(filename, line, col, LYFT, "a Lyft config file is a mapping with 'domain' and 'descriptors'")]
        )
    _lyft_text(doc.data, doc, ())
    try:
        config = LyftFile.model_validate(doc.data)
    except ValidationError as exc:
        problems = _map_errors(exc, doc, filename, root=LyftFile, label=LYFT)
        problems.sort(key=lambda p: (p.line, p.col))
        raise ConfigError(problems) from None
    problems = []
    if not config.domain:
        line, col = doc.pos(("domain",))
        problems.append(Problem(filename, line, col, LYFT, "config file cannot have empty domain"))
    problems.extend(_http_semantic(config.descriptors, config.domain, doc, filename, (), LYFT))
    if problems:
        problems.sort(key=lambda p: (p.line, p.col))
        raise ConfigError(problems)
    return LyftLoaded(config=config, path=filename, text=text, doc=doc)


# --- mapping pydantic errors ----------------------------------------------------


def _rule_label(data: Any, loc: tuple[Any, ...]) -> str:
    """The name an error is reported under: the rule's name, or the section."""
    if not loc:
        return "file"
    section = loc[0]
    if section in ("network", "bandwidth") and len(loc) >= 2 and isinstance(loc[1], int):
        try:
            name = data[section][loc[1]].get("name")
        except (AttributeError, IndexError, KeyError, TypeError):
            name = None
        return str(name) if isinstance(name, str) and name else f"{section}[{loc[1]}]"
    if section == "http":
        return "http"
    return str(section)


def _model_at(loc: tuple[Any, ...], root: type[BaseModel] = Config) -> type[BaseModel] | None:
    """The model whose fields live at `loc` (for did-you-mean)."""
    model: type[BaseModel] | None = root
    items: dict[str, type[BaseModel]] = {
        "network": NetworkRule,
        "bandwidth": BandwidthRule,
        "http": HttpConfig,
        "descriptors": Descriptor,
        "rate_limit": RateLimit,
        "replaces": Replaces,
        "escalate": Escalate,
        "bans": BansConfig,
    }
    for part in loc:
        if isinstance(part, int):
            continue
        nxt = items.get(part) if model is not None and part in model.model_fields else None
        if nxt is None:
            return None
        model = nxt
    return model


def _plain_loc(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """Drop pydantic's function-name segments (e.g. 'function-after[...]')."""
    return tuple(
        p for p in loc if isinstance(p, int) or not (isinstance(p, str) and ("[" in p or p.startswith("function")))
    )


def _map_errors(
    exc: ValidationError, doc: Document, filename: str, *, root: type[BaseModel] = Config, label: str | None = None
) -> list[Problem]:
    problems: list[Problem] = []
    seen: set[tuple[int, int, str]] = set()
    for err in exc.errors(include_url=False):
        loc = _plain_loc(tuple(err["loc"]))
        etype = err["type"]
        msg = err["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        if etype == "extra_forbidden":
            field_name = loc[-1]
            model = _model_at(loc[:-1], root)
            hint = ""
            if model is not None:
                close = difflib.get_close_matches(str(field_name), list(model.model_fields), n=1, cutoff=0.6)
                if close:
                    hint = f" (did you mean '{close[0]}'?)"
                else:
                    hint = f"; known fields: {', '.join(model.model_fields)}"
            msg = f"unknown field '{field_name}'{hint}"
            line, col = doc.pos(loc, key=True)
        elif etype == "missing":
            msg = f"missing required field '{loc[-1]}'"
            line, col = doc.pos(loc[:-1])
        elif etype == "literal_error":
            expected = err.get("ctx", {}).get("expected", "")
            msg = f"'{loc[-1]}' must be one of {expected.replace(' or ', ', ')}, got {err.get('input')!r}"
            line, col = doc.pos(loc)
        elif etype in ("int_type", "int_parsing", "int_from_float"):
            msg = f"'{loc[-1]}' must be a whole number, got {err.get('input')!r}"
            line, col = doc.pos(loc)
        elif etype in ("bool_type", "bool_parsing"):
            msg = f"'{loc[-1]}' must be true or false, got {err.get('input')!r}"
            line, col = doc.pos(loc)
        elif etype in ("list_type",):
            msg = f"'{_last_name(loc)}' must be a list (YAML '- item' lines or [a, b])"
            line, col = doc.pos(loc)
        elif etype in ("model_type", "dict_type", "model_attributes_type"):
            msg = f"'{_last_name(loc)}' must be a mapping of fields, got {type(err.get('input')).__name__}"
            line, col = doc.pos(loc)
        elif etype in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
            msg = f"'{loc[-1]}' {msg[0].lower()}{msg[1:]}, got {err.get('input')!r}"
            line, col = doc.pos(loc)
        elif etype == "too_short":
            need = err.get("ctx", {}).get("min_length", 1)
            msg = f"'{_last_name(loc)}' needs at least {need} item{'s' if need != 1 else ''}, got an empty list"
            line, col = doc.pos(loc)
        elif etype == "invalid_key":
            key_val = err.get("input")
            msg = f"key is not of type string: {key_val!r}"
            line, col = doc.pos(loc[:-1] + (key_val,), key=True)
        elif etype == "string_type":
            msg = f"'{_last_name(loc)}' must be text, got {err.get('input')!r}"
            line, col = doc.pos(loc)
        else:
            line, col = doc.pos(loc)
            if (
                loc
                and isinstance(loc[-1], str)
                and not msg.startswith(("'", "set ", "bad "))
                and etype != "value_error"
            ):
                msg = f"'{loc[-1]}': {msg}"
        key = (line, col, msg)
        if key in seen:
            continue
        seen.add(key)
        label_loc = loc[:-1] if etype in ("missing", "extra_forbidden") and len(loc) == 1 else loc
        problems.append(Problem(filename, line, col, label or _rule_label(doc.data, label_loc), msg))
    return problems


def _last_name(loc: tuple[Any, ...]) -> str:
    for part in reversed(loc):
        if isinstance(part, str):
            return part
    return "value"


# --- meaning ------------------------------------------------------------------


def hashlimit_name(rule_name: str) -> str:
    """Kernel hashlimit table name for a rule (<= 15 chars, deterministic, unique)."""
    if len(rule_name) <= kl.HASHLIMIT_NAME_MAX:
        return rule_name
    digest = hashlib.sha1(rule_name.encode()).hexdigest()[:5]
    return f"{rule_name[:9]}~{digest}"


def secret_warnings(loaded: Loaded) -> list[Problem]:
    """A Redis password written in a file that every user may read (the sidecar's
    DynamicUser needs the file world-readable, so the password belongs elsewhere:
    ${VAR}, password_file=, systemd LoadCredential=; docs/operations.md)."""
    from .redis_url import inline_password

    try:
        mode = os.stat(loaded.path).st_mode
    except OSError:
        return []
    if not mode & 0o004:
        return []
    c = loaded.config
    urls: list[tuple[tuple[Any, ...], str, str | None]] = []
    if c.http is not None:
        urls.append((("http", "storage"), "http", c.http.storage))
    if c.bans is not None:
        urls.append((("bans", "store"), "bans", c.bans.store))
    out = []
    for path, rule, url in urls:
        if url and url != "memory" and inline_password(url):
            line, col = loaded.position(*path)
            out.append(
                Problem(
                    loaded.path,
                    line,
                    col,
                    rule,
                    f"warning: a Redis password in a file every user can read (mode {mode & 0o777:04o}): take it from "
                    "the environment (${REDIS_PASSWORD}) or a file (?password_file=${CREDENTIALS_DIRECTORY}/redis, "
                    "systemd LoadCredential=); docs/operations.md, Secrets",
                )
            )
    return out


def recent_bucket_warnings(loaded: Loaded) -> list[Problem]:
    """What `method: recent` means under nftables (its backend asks: FilterBackend.warnings)."""
    out: list[Problem] = []
    for i, r in enumerate(loaded.config.network):
        if r.method == "recent" and r.limit is not None:
            line, col = loaded.position("network", i, "method")
            out.append(
                Problem(
                    loaded.path,
                    line,
                    col,
                    r.name,
                    f"warning: under the nftables backend, method: recent is a bucket of {r.limit.count} per "
                    "period per address plus a ban that every attempt renews (nft keeps no hit log): a client "
                    "that keeps knocking once blocked stays blocked, as with recent, but one that keeps coming a "
                    f"little faster than {r.limit} passes until its bucket runs dry, where recent blocks it at "
                    f"hit {r.limit.count + 1} (README: recent under nftables, measured)",
                )
            )
    return loaded.decode(out)


def _semantic(config: Config, doc: Document, filename: str, warnings: list[Problem]) -> list[Problem]:
    out: list[Problem] = []
    limits = kl.host_limits()

    def add(path: tuple[Any, ...], rule: str, message: str, *, key: bool = False) -> None:
        line, col = doc.pos(path, key=key)
        out.append(Problem(filename, line, col, rule, message))

    def warn(path: tuple[Any, ...], rule: str, message: str) -> None:
        line, col = doc.pos(path)
        warnings.append(Problem(filename, line, col, rule, f"warning: {message}"))

    names: dict[str, tuple[str, int]] = {}
    hl_names: dict[str, str] = {}
    sections: tuple[tuple[str, Sequence[NetworkRule | BandwidthRule]], ...] = (
        ("network", config.network),
        ("bandwidth", config.bandwidth),
    )
    for section, rules in sections:
        for i, rule in enumerate(rules):
            where = (section, i, "name")
            if rule.name in names:
                sec0, i0 = names[rule.name]
                line0 = doc.pos((sec0, i0, "name"))[0]
                add(
                    where,
                    rule.name,
                    f"duplicate rule name (first used at line {line0}); names must be unique "
                    "across network and bandwidth",
                )
            else:
                names[rule.name] = (section, i)

    for i, r in enumerate(config.network):
        p = ("network", i)
        if r.ports and r.protocol not in ("tcp", "udp"):
            add(p + ("ports",), r.name, f"ports need protocol: tcp or udp (protocol is {r.protocol})")
        if r.new_connections and r.protocol not in ("tcp", "all", "udp"):
            add(
                p + ("new_connections",),
                r.name,
                f"new_connections counts TCP/UDP connections; protocol {r.protocol} has none",
            )
        fams = r.families
        if r.source_prefix is not None and 4 not in fams:
            add(
                p + ("source_prefix",),
                r.name,
                "source_prefix is for IPv4 but this rule only matches IPv6 addresses: use source_prefix6",
            )
        if r.source_prefix6 is not None and 6 not in fams:
            add(
                p + ("source_prefix6",),
                r.name,
                "source_prefix6 is for IPv6 but this rule only matches IPv4 addresses: use source_prefix",
            )
        srcs, dsts = r.sources, r.destinations
        if srcs and dsts and not ({n.version for n in srcs} & {n.version for n in dsts}):
            add(
                p + ("destinations",),
                r.name,
                "sources and destinations are of different IP families: no packet can match both",
            )
        if r.max_connections is not None:
            if r.method != "hashlimit" and "method" in doc.data["network"][i]:
                add(p + ("method",), r.name, "method applies to 'limit' rules; max_connections uses connlimit")
            if r.burst is not None:
                add(p + ("burst",), r.name, "burst applies to 'limit' rules, not max_connections")
            if r.per in ("source+port",):
                add(
                    p + ("per",),
                    r.name,
                    "max_connections counts per source, destination or all; "
                    "'source+port' is not possible with connlimit",
                )
            if r.protocol not in ("tcp", "udp"):
                add(p + ("protocol",), r.name, "max_connections needs protocol: tcp (or udp)")
            continue
        assert r.limit is not None
        rate = r.limit
        if r.method == "recent":
            if rate.count > limits.recent_max_hitcount:
                add(
                    p + ("limit",),
                    r.name,
                    f"method: recent can count at most {limits.recent_max_hitcount} hits per address "
                    f"({limits.recent_source}); {rate} needs more: use method: hashlimit",
                )
            if r.per not in ("source", "destination"):
                add(
                    p + ("per",),
                    r.name,
                    f"method: recent tracks one address per entry: per must be source or "
                    f"destination, not {r.per} (use method: hashlimit)",
                )
            if r.burst is not None:
                add(p + ("burst",), r.name, "method: recent has no burst: it allows exactly N per window")
            if r.source_prefix is not None or r.source_prefix6 is not None:
                add(p + ("method",), r.name, "method: recent cannot group sources by prefix: use method: hashlimit")
            if not r.new_connections:
                warn(
                    p + ("method",),
                    r.name,
                    "method: recent without new_connections: true counts every "
                    "packet as a hit (fine for e.g. pings; for connections set "
                    "new_connections: true)",
                )
            for fld in ("htable_size", "htable_max", "htable_expire"):
                if getattr(r, fld) is not None:
                    add(p + (fld,), r.name, f"{fld} applies to method: hashlimit only")
        else:
            if r.source_prefix is not None and r.per not in ("source", "source+port"):
                add(
                    p + ("source_prefix",),
                    r.name,
                    f"source_prefix groups sources, but per is {r.per}: use per: source (or source+port)",
                )
            if r.source_prefix6 is not None and r.per not in ("source", "source+port"):
                add(
                    p + ("source_prefix6",),
                    r.name,
                    f"source_prefix6 groups sources, but per is {r.per}: use per: source (or source+port)",
                )
            if rate.exact() is None:
                add(
                    p + ("limit",),
                    r.name,
                    f"hashlimit counts per second, minute, hour or day: {rate} is not a "
                    "whole number per any of them; pick another rate or use method: recent",
                )
            elif rate.per_second > kl.HASHLIMIT_MAX_PER_SECOND:
                add(
                    p + ("limit",),
                    r.name,
                    f"{rate} is faster than hashlimit can express (at most {kl.HASHLIMIT_MAX_PER_SECOND}/second)",
                )
            elif rate.period / rate.count > kl.HASHLIMIT_MAX_INTERVAL_S:
                add(
                    p + ("limit",),
                    r.name,
                    f"{rate} is slower than hashlimit can express (at least one per "
                    f"{int(kl.HASHLIMIT_MAX_INTERVAL_S)} s, e.g. 1/hour or 21/day); "
                    "for new connections use method: recent",
                )
            if r.burst is not None and r.burst > kl.HASHLIMIT_BURST_MAX:
                add(p + ("burst",), r.name, f"burst {r.burst} is above hashlimit's maximum {kl.HASHLIMIT_BURST_MAX}")
            hl = hashlimit_name(r.name)
            if hl in hl_names:
                add(p + ("name",), r.name, f"hashlimit table name {hl!r} collides with rule {hl_names[hl]!r}")
            hl_names[hl] = r.name
            if r.htable_max is not None and r.htable_size is not None and r.htable_max < r.htable_size:
                add(p + ("htable_max",), r.name, "htable_max must be at least htable_size")

    hz = limits.hz
    for i, b in enumerate(config.bandwidth):
        p = ("bandwidth", i)
        if b.burst is not None:
            need = kl.min_tc_burst(b.rate, hz)
            if b.burst < need:
                add(
                    p + ("burst",),
                    b.name,
                    f"burst {b.burst} bytes is below one MTU-sized frame per timer tick at this rate "
                    f"({need} bytes at HZ={hz}); the cap would not be reached. Raise it or omit burst "
                    f"(default {kl.default_tc_burst(b.rate, hz)} bytes)",
                )
        if b.protocol != "all" and not b.ports:
            add(p + ("protocol",), b.name, "protocol only narrows port matches: add ports or drop protocol")
    _escalation(config, doc, add)
    _deny(config, doc, add)
    # whole-interface caps: at most one per interface and direction
    seen_whole: dict[tuple[str, str], str] = {}
    for i, b in enumerate(config.bandwidth):
        if b.whole_interface:
            k = (b.interface, b.direction)
            if k in seen_whole:
                add(
                    ("bandwidth", i, "interface"),
                    b.name,
                    f"{b.direction} on {b.interface} already has a whole-interface rate in rule "
                    f"{seen_whole[k]!r}: one interface has one cap per direction",
                )
            seen_whole[k] = b.name
    return out


# --- deny ------------------------------------------------------------------------


def _deny(config: Config, doc: Document, add: Any) -> None:
    """A deny entry overlapping an exempt one is refused: exempt is matched first, so the
    overlap would be silently allowed (or, the other way round, an exempt host dropped)."""
    for i, net in enumerate(config.deny):
        for j, ex in enumerate(config.exempt):
            if net.version == ex.version and (net.subnet_of(ex) or net.supernet_of(ex)):  # type: ignore[arg-type]
                line = doc.pos(("exempt", j))[0]
                add(
                    ("deny", i),
                    "deny",
                    f"{net} overlaps exempt {ex} (line {line}): exempt is matched first, so the overlap would "
                    "never be dropped; remove one of them",
                )
                break


# --- escalation ------------------------------------------------------------------


def _covered(net: Any, by: Sequence[Any]) -> bool:
    return any(net.version == n.version and net.subnet_of(n) for n in by)


def _escalation(config: Config, doc: Document, add: Any) -> None:
    """What the models cannot see about `escalate` and `bans:`: a rule must be able to
    deny and to name a client, and must be able to ban someone who is neither exempt
    nor a trusted proxy (those are never banned)."""
    exempt = list(config.exempt)
    proxies = list(config.http.trusted_proxies) if config.http is not None else []
    for i, r in enumerate(config.network):
        esc = r.escalate
        if esc is None:
            continue
        p = ("network", i, "escalate")
        if r.action == "log":
            add(p, r.name, "escalate needs a rule that drops or rejects: action: log never denies, so never bans")
        if Rate(esc.after, "second", esc.within).exact() is None:
            add(
                p + ("within",),
                r.name,
                f"the kernel counts over-limit packets as a whole number per second, minute, hour or day: "
                f"{esc.after} within {esc.within} s is none of them (e.g. within: 1m)",
            )
        if r.sources and all(_covered(n, exempt) for n in r.sources):
            add(p, r.name, "escalate could only ban exempt addresses (every source of this rule is in exempt:)")
    for path, d in _descriptor_paths(config):
        esc = d.escalate
        if esc is None:
            continue
        keys = [k for k, _v in path[1]]
        where = path[0] + ("escalate",)
        if d.rate_limit is None:
            add(where, "http", "escalate needs a descriptor with rate_limit: it counts this limit's denials")
        elif d.shadow_mode:
            add(where, "http", "escalate on a shadow_mode descriptor never fires: shadow rules never deny")
        if "remote_address" not in keys:
            add(
                where,
                "http",
                "escalate bans the client's address: this descriptor (or one above it) needs key remote_address",
            )
            continue
        value = next(v for k, v in reversed(path[1]) if k == "remote_address")
        if value and not value.endswith("*"):
            try:
                addr = ipaddress.ip_network(value, strict=False)
            except ValueError:
                continue
            if _covered(addr, exempt) or _covered(addr, proxies):
                add(
                    where,
                    "http",
                    f"escalate could only ban {value}, which is exempt or a trusted proxy (never banned)",
                )


def _descriptor_paths(config: Config) -> list[tuple[tuple[tuple[Any, ...], list[tuple[str, str | None]]], Descriptor]]:
    """Each descriptor with (its position in the file, the (key, value) entries from the root)."""
    out: list[tuple[tuple[tuple[Any, ...], list[tuple[str, str | None]]], Descriptor]] = []

    def walk(descs: list[Descriptor], where: tuple[Any, ...], entries: list[tuple[str, str | None]]) -> None:
        for i, d in enumerate(descs):
            here = where + ("descriptors", i)
            e = entries + [(d.key, d.value)]
            out.append(((here, e), d))
            walk(d.descriptors, here, e)

    if config.http is not None:
        walk(config.http.descriptors, ("http",), [])
    return out
