"""YAML loading that remembers where every key and value came from.

PyYAML's safe_load forgets positions and silently keeps the last of two equal
keys. We compose the node graph ourselves, build plain Python values, and keep
a map from each path (tuple of keys / indices) to the (line, column) of its key
and of its value, 1-based, so that every error can name FILE:LINE:COL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

Path = tuple[Any, ...]


@dataclass
class Problem:
    """One problem in one file, printed as FILE:LINE:COL: RULE: MESSAGE."""

    file: str
    line: int
    col: int
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}: {self.rule}: {self.message}"


@dataclass
class Document:
    data: Any
    key_pos: dict[Path, tuple[int, int]] = field(default_factory=dict)
    value_pos: dict[Path, tuple[int, int]] = field(default_factory=dict)

    def pos(self, path: Path, *, key: bool = False) -> tuple[int, int]:
        """Best position for a path: the exact node, else its nearest ancestor."""
        path = tuple(path)
        while True:
            if key and path in self.key_pos:
                return self.key_pos[path]
            if path in self.value_pos:
                return self.value_pos[path]
            if path in self.key_pos:
                return self.key_pos[path]
            if not path:
                return (1, 1)
            path = path[:-1]


class YamlError(Exception):
    def __init__(self, problems: list[Problem]):
        super().__init__("\n".join(map(str, problems)))
        self.problems = problems


def _mark(node: yaml.Node) -> tuple[int, int]:
    return (node.start_mark.line + 1, node.start_mark.column + 1)


def load_text(text: str, filename: str) -> Document:
    """Parse YAML text into a Document; raise YamlError with positions."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        what = exc.problem or str(exc)
        if exc.context:
            what = f"{exc.context}: {what}"
        raise YamlError([Problem(filename, line, col, "yaml", f"YAML syntax error: {what}")]) from None
    except yaml.YAMLError as exc:  # pragma: no cover - non-marked errors are rare
        raise YamlError([Problem(filename, 1, 1, "yaml", f"YAML error: {exc}")]) from None

    doc = Document(data=None)
    problems: list[Problem] = []
    constructor = yaml.SafeLoader("")  # only used to turn scalar nodes into Python values

    def build(node: yaml.Node, path: Path, depth: int = 0) -> Any:
        if depth > 64:
            problems.append(Problem(filename, *_mark(node), "yaml", "nesting deeper than 64 levels"))
            return None
        doc.value_pos[path] = _mark(node)
        if isinstance(node, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    problems.append(
                        Problem(
                            filename,
                            *_mark(key_node),
                            "yaml",
                            "YAML merge keys ('<<') are not supported: write the fields out",
                        )
                    )
                    continue
                key = build(key_node, path + ("<key>",), depth + 1)
                if isinstance(key, (list, dict)):
                    problems.append(Problem(filename, *_mark(key_node), "yaml", "a key must be a plain value"))
                    continue
                if key in out:
                    first = doc.key_pos.get(path + (key,), (0, 0))
                    problems.append(
                        Problem(
                            filename,
                            *_mark(key_node),
                            "yaml",
                            f"duplicate key {key!r} (first at line {first[0]}); YAML would silently keep only the last",
                        )
                    )
                    continue
                doc.key_pos[path + (key,)] = _mark(key_node)
                out[key] = build(value_node, path + (key,), depth + 1)
            return out
        if isinstance(node, yaml.SequenceNode):
            return [build(item, path + (i,), depth + 1) for i, item in enumerate(node.value)]
        return constructor.construct_object(node, deep=True)

    doc.data = build(root, ()) if root is not None else None
    doc.value_pos.pop(("<key>",), None)
    for p in [p for p in doc.value_pos if "<key>" in p]:
        del doc.value_pos[p]
    if problems:
        raise YamlError(problems)
    return doc
