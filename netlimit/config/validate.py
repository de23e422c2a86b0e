"""Load + validate a netlimit file: every problem as FILE:LINE:COL: RULE: MESSAGE.

Three passes, each reporting all it finds:
1. YAML syntax and duplicate keys (loader.py);
2. shape and types (pydantic models, errors mapped back to line/column, with
   did-you-mean for unknown fields: pydantic_errors.py);
3. meaning: duplicate names, limits this kernel cannot honour (semantic.py), and
   the checks envoyproxy/ratelimit makes of its config (duplicate descriptors,
   ``replaces`` naming its own descriptor, ``share_threshold`` without a wildcard,
   ...), with Lyft's messages -- for the ``http:`` section and for every file of
   its ``lyft_config_dir`` alike (lyft.py), so ``netlimit validate`` and the
   sidecar refuse the same files.

This module is the entry (load_file, load_string, Loaded); the names the rest of
netlimit imports from it (LyftLoaded, load_lyft_dir, hashlimit_name,
MAX_FILE_BYTES, ...) stay importable from here.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path as FsPath
from typing import Any

from pydantic import ValidationError

from ..errors import ConfigError
from .files import MAX_FILE_BYTES
from .files import read_text as _read_text
from .loader import Document, Problem, YamlError, load_text
from .lyft import (
    LYFT,
    MAX_LYFT_FILES,
    LyftLoaded,
    http_semantic,
    load_lyft_dir,
    load_lyft_string,
    lyft_dir_path,
    lyft_text,
)
from .model import Config
from .pydantic_errors import map_errors
from .semantic import hashlimit_name, semantic

#: what the rest of netlimit imports from here (the warnings below besides)
__all__ = [
    "LYFT",
    "MAX_FILE_BYTES",
    "MAX_LYFT_FILES",
    "ConfigError",
    "Loaded",
    "LyftLoaded",
    "hashlimit_name",
    "load_file",
    "load_lyft_dir",
    "load_lyft_string",
    "load_string",
    "lyft_dir_path",
]


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
        lyft_text(doc.data["http"], doc, ("http",))
    try:
        config = Config.model_validate(doc.data)
    except ValidationError as exc:
        problems.extend(map_errors(exc, doc, filename))
        problems.sort(key=lambda p: (p.line, p.col))
        raise ConfigError(problems) from None
    warnings: list[Problem] = []
    problems.extend(semantic(config, doc, filename, warnings))
    lyft: list[LyftLoaded] = []
    if config.http is not None:
        http = config.http
        problems.extend(http_semantic(http.descriptors, http.domain, doc, filename, ("http",), "http"))
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
                    "the environment (${REDIS_PASSWORD}) or a systemd credential (/etc/netlimit/credentials/redis, "
                    "0600, and password_file: ${CREDENTIALS_DIRECTORY}/netlimit_redis); docs/operations.md, Secrets",
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


def ingress_ignored_warnings(loaded: Loaded) -> list[Problem]:
    """`ingress:` under a legacy x_tables backend (its backend asks: FilterBackend.warnings):
    x_tables have no ingress hook, so deny and the bans stay in INPUT."""
    if loaded.config.ingress is None:
        return []
    line, col = loaded.position("ingress")
    msg = (
        "warning: ingress: needs the nftables backend (x_tables have no ingress hook); "
        "deny and the bans are matched in INPUT"
    )
    return loaded.decode([Problem(loaded.path, line, col, "ingress", msg)])
