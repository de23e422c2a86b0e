"""Lyft's config (envoyproxy/ratelimit): the text of its fields as written, a
``lyft_config_dir`` of files, and the checks Lyft makes of a descriptor tree,
with its messages -- for the ``http:`` section and for every Lyft file alike."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path as FsPath
from typing import Any

from pydantic import ValidationError

from ..errors import ConfigError
from .files import read_text
from .loader import Document, Problem, YamlError, load_text
from .model import Descriptor, LyftFile
from .pydantic_errors import map_errors

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


def lyft_text(node: Any, doc: Document, path: tuple[Any, ...]) -> None:
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


def http_semantic(
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
            lf = load_lyft_string(read_text(path), path)
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
    lyft_text(doc.data, doc, ())
    try:
        config = LyftFile.model_validate(doc.data)
    except ValidationError as exc:
        problems = map_errors(exc, doc, filename, root=LyftFile, label=LYFT)
        problems.sort(key=lambda p: (p.line, p.col))
        raise ConfigError(problems) from None
    problems = []
    if not config.domain:
        line, col = doc.pos(("domain",))
        problems.append(Problem(filename, line, col, LYFT, "config file cannot have empty domain"))
    problems.extend(http_semantic(config.descriptors, config.domain, doc, filename, (), LYFT))
    if problems:
        problems.sort(key=lambda p: (p.line, p.col))
        raise ConfigError(problems)
    return LyftLoaded(config=config, path=filename, text=text, doc=doc)
