"""``include:``: a file's rules spread over several files (``conf.d``).

    include: [/etc/netlimit/conf.d/*.yaml]

Each entry is a path or a glob, relative to the including file's directory;
the files a glob matches are taken in name order, the entries in the order
written.  An included file holds any of ``exempt``, ``network`` and
``bandwidth`` (and ``version: 1`` if it likes); its lists are appended, file
by file, to the including file's.  A glob that matches nothing is fine (an
empty conf.d); a plain path that does not exist is an error.  Included files
include nothing further.

The merged file is validated as one (so duplicate rule names across files are
refused, every cross-rule check sees every rule), and every problem still
names the file, line and column it is in: positions of an included file's
nodes are carried as ``line + k * LINE_BASE`` (k: the file's number) through
the one-file checks and turned back into FILE:LINE afterwards
(``Includes.decode``).
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from .loader import Document, Problem, YamlError, load_text

#: the sections an included file may hold (lists, appended)
SECTIONS = ("exempt", "network", "bandwidth")
#: at most this many included files
MAX_INCLUDED = 1000
#: a line number at or above this belongs to included file number line // LINE_BASE
LINE_BASE = 10_000_000
_GLOB = re.compile(r"[*?\[]")
_LINE_REF = re.compile(r"\bline (\d+)")


@dataclass
class Includes:
    """The files merged into one document: names and texts, main file first."""

    files: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)

    def where(self, line: int) -> tuple[str, int]:
        k, rest = divmod(line, LINE_BASE)
        return (self.files[k] if 0 <= k < len(self.files) else self.files[0]), rest

    def decode(self, problems: list[Problem]) -> list[Problem]:
        """Problems with their real file and line (and "line N" in messages made
        FILE:N when N is in another file than the problem)."""
        out = []
        for p in problems:
            if p.file != self.files[0]:
                out.append(p)  # already an included file's own (YAML, size, ...)
                continue
            file, line = self.where(p.line)

            def ref(m: re.Match[str], file: str = file) -> str:
                f2, n = self.where(int(m.group(1)))
                return f"line {n}" if f2 == file else f"{f2}:{n}"

            out.append(Problem(file, line, p.col, p.rule, _LINE_REF.sub(ref, p.message)))
        return out


def _expand(entries: list[Any], main: str, doc: Document) -> tuple[list[str], list[Problem]]:
    base = os.path.dirname(os.path.abspath(main)) if not main.startswith("<") else os.getcwd()
    paths: list[str] = []
    problems: list[Problem] = []
    for i, entry in enumerate(entries):
        line, col = doc.pos(("include", i))
        if not isinstance(entry, str) or not entry.strip():
            problems.append(Problem(main, line, col, "include", f"expected a path or a glob, got {entry!r}"))
            continue
        pattern = os.path.join(base, os.path.expanduser(entry.strip()))
        if _GLOB.search(entry):
            found = sorted(glob.glob(pattern), key=lambda p: (os.path.basename(p), p))
            found = [p for p in found if os.path.isfile(p)]
        elif os.path.exists(pattern):
            found = [pattern]
        else:
            problems.append(Problem(main, line, col, "include", f"{entry!r}: no such file"))
            continue
        for p in found:
            if os.path.abspath(p) == os.path.abspath(main):
                continue  # a glob over the main file's own directory
            if p not in paths:
                paths.append(p)
    if len(paths) > MAX_INCLUDED:
        line, col = doc.pos(("include",))
        problems.append(
            Problem(main, line, col, "include", f"{len(paths)} files included; at most {MAX_INCLUDED} are read")
        )
    return paths, problems


def _shift(path: tuple[Any, ...], offsets: dict[str, int]) -> tuple[Any, ...]:
    if len(path) >= 2 and path[0] in offsets and isinstance(path[1], int):
        return (path[0], path[1] + offsets[path[0]], *path[2:])
    return path


def merge(doc: Document, main: str, read_text: Any) -> tuple[Document, Includes]:
    """The main document with every included file's lists appended (positions
    encoded); raises ConfigError for problems with the include list or the files."""
    entries = doc.data.get("include")
    inc = Includes([main], [])
    if entries is None:
        return doc, inc
    if not isinstance(entries, list):
        entries = [entries]  # a single string; the model reports anything else
        if not isinstance(entries[0], str):
            return doc, inc
    paths, problems = _expand(entries, main, doc)
    merged = Document(dict(doc.data), dict(doc.key_pos), dict(doc.value_pos), dict(doc.text))
    for s in SECTIONS:
        if isinstance(merged.data.get(s), list):
            merged.data[s] = list(merged.data[s])
    for path in paths[:MAX_INCLUDED]:
        try:
            text = read_text(path)
            sub = load_text(text, path)
        except ConfigError as exc:
            problems.extend(exc.problems)
            continue
        except YamlError as exc:
            problems.extend(exc.problems)
            continue
        k = len(inc.files)
        inc.files.append(path)
        inc.texts.append(text)
        if sub.data is None:
            continue  # an empty file: nothing to add
        if not isinstance(sub.data, dict):
            line, col = sub.pos(())
            problems.append(
                Problem(path, line, col, "include", "an included file is a mapping of " + ", ".join(SECTIONS))
            )
            continue
        offsets: dict[str, int] = {}
        for key, value in sub.data.items():
            line, col = sub.pos((key,), key=True)
            if key == "version":
                if value != 1:
                    problems.append(Problem(path, line, col, "include", f"version must be 1, got {value!r}"))
                continue
            if key not in SECTIONS:
                what = "include: is not followed in an included file" if key == "include" else f"'{key}'"
                problems.append(
                    Problem(path, line, col, "include", f"{what}: an included file holds only {', '.join(SECTIONS)}")
                )
                continue
            if not isinstance(value, list):
                problems.append(Problem(path, line, col, "include", f"'{key}' must be a list"))
                continue
            have = merged.data.get(key)
            if have is None:
                have = merged.data[key] = []
                merged.key_pos[(key,)] = (line + k * LINE_BASE, col)
            if not isinstance(have, list):
                continue  # the main file's own error says so
            offsets[key] = len(have)
            have.extend(value)

        def enc(pos: tuple[int, int], k: int = k) -> tuple[int, int]:
            return (pos[0] + k * LINE_BASE, pos[1])

        for src, dst in ((sub.key_pos, merged.key_pos), (sub.value_pos, merged.value_pos)):
            for p, pos in src.items():
                if len(p) >= 2 and p[0] in offsets:
                    dst[_shift(p, offsets)] = enc(pos)
        for p, t in sub.text.items():
            if len(p) >= 2 and p[0] in offsets:
                merged.text[_shift(p, offsets)] = t
    if problems:
        raise ConfigError(problems)
    return merged, inc
