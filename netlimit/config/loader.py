"""YAML loading that remembers where every key and value came from.

PyYAML's safe_load forgets positions and silently keeps the last of two equal
keys. We compose the node graph ourselves, build plain Python values, and keep
a map from each path (tuple of keys / indices) to the (line, column) of its key
and of its value, 1-based, so that every error can name FILE:LINE:COL.

Plain scalars that YAML 1.1 reads as something other than text (``1.10``,
``0755``, ``1:30``, ``NO``, dates) also keep the text as written
(``Document.text``): envoyproxy/ratelimit (go-yaml) reads descriptor keys and
values as written, so lyft.py gives those fields the text back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from ..errors import NetlimitError

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
    #: the text of plain scalars that YAML did not read as text (not null)
    text: dict[Path, str] = field(default_factory=dict)

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


class YamlError(NetlimitError):
    def __init__(self, problems: list[Problem]):
        super().__init__("\n".join(map(str, problems)))
        self.problems = problems


def _mark(node: yaml.Node) -> tuple[int, int]:
    return (node.start_mark.line + 1, node.start_mark.column + 1)


_MARKER = re.compile(r"^([ \t]+)---[ \t]*(#.*)?$")
_HTTP = re.compile(r"^http:[ \t]*(#.*)?$")


def _pasted_marker(text: str) -> str:
    """A Lyft file pasted, indented, under ``http:`` may keep its leading ``---``
    document marker (there it is no YAML): that one line becomes a comment of
    the same length, so every position stays where it was."""
    if "---" not in text:
        return text
    lines = text.split("\n")
    prev = ""
    for i, line in enumerate(lines):
        m = _MARKER.match(line)
        if m and _HTTP.match(prev):
            lines[i] = m.group(1) + "#--" + line[len(m.group(1)) + 3 :]
            return "\n".join(lines)
        if line.strip() and not line.lstrip().startswith("#"):
            prev = line
    return text


#: nodes a file may hold as written (scalars, mappings, sequences): a big
#: config has a few hundred (rules/example-all.yaml: 131), the 1000-rule file of
#: scripts/faults.py 12,005, the benchmarks' 5,000-rule file about 60,000 (50,000
#: refused it); at the budget, 100,000 nodes of junk cost 1 s and 101 MiB to refuse
MAX_NODES = 100_000
#: nodes that aliases may add once expanded, over the whole file: anchors for a
#: shared rate or a list of exempt networks are fine, a "billion laughs" is not
MAX_ALIAS_NODES = 10_000
#: nesting of mappings and sequences
MAX_DEPTH = 64

# libyaml's parser and composer (C: a 1 MiB file in milliseconds, where PyYAML's
# own scanner takes a second); PyYAML's when it was built without libyaml
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Refused(NetlimitError):
    """The file goes past one of the loader's budgets."""

    def __init__(self, mark: Any, message: str):
        super().__init__(message)
        self.mark = mark
        self.message = message


def _check_budgets(text: str) -> None:
    """Walk the parser's events once, before anything is built, and refuse a
    file past a budget: nodes, nesting depth, and the nodes aliases add once
    expanded. PyYAML keeps an alias as a second reference to its anchored node;
    ``build`` below expands it, so nine levels of nine aliases each (a 500-byte
    file) would be hundreds of millions of nodes. Here each anchor's expanded
    size is known when its node ends, an alias is charged that size where it
    stands, and the first alias past the budget is named. An alias inside its
    own anchor (``&a [*a]``) has no finite expansion: refused too. The walk
    keeps only a stack as deep as the nesting and one number per anchor, so a
    refused file costs no memory; syntax errors raise here as the composer
    would raise them."""
    loader = _LOADER(text)
    nodes = alias_nodes = 0
    #: per open collection: [expanded size so far, its anchor]
    stack: list[list[Any]] = []
    #: expanded size per anchor (None while its node is still open)
    sizes: dict[str, int | None] = {}
    try:
        while loader.check_event():
            ev = loader.get_event()
            if isinstance(ev, (yaml.ScalarEvent, yaml.CollectionStartEvent)):
                nodes += 1
                if nodes > MAX_NODES:
                    raise _Refused(ev.start_mark, f"more than {MAX_NODES} YAML nodes: this is not a config file")
                if isinstance(ev, yaml.CollectionStartEvent):
                    if len(stack) >= MAX_DEPTH:
                        raise _Refused(ev.start_mark, f"nesting deeper than {MAX_DEPTH} levels")
                    if ev.anchor is not None:
                        sizes[ev.anchor] = None
                    stack.append([1, ev.anchor])
                    continue
                size = 1
                if ev.anchor is not None:
                    sizes[ev.anchor] = 1
            elif isinstance(ev, yaml.CollectionEndEvent):
                size, anchor = stack.pop()
                if anchor is not None:
                    sizes[anchor] = size
            elif isinstance(ev, yaml.AliasEvent):
                if ev.anchor not in sizes:
                    continue  # the composer says "found undefined alias"
                known = sizes[ev.anchor]
                if known is None:
                    raise _Refused(
                        ev.start_mark,
                        f"alias *{ev.anchor} stands inside its own anchor &{ev.anchor} "
                        "(a recursive structure): write the value out",
                    )
                size = known
                alias_nodes += size
                if alias_nodes > MAX_ALIAS_NODES:
                    raise _Refused(
                        ev.start_mark,
                        f"alias *{ev.anchor} expands to {size} nodes, which makes {alias_nodes} "
                        f"nodes from aliases; at most {MAX_ALIAS_NODES} are allowed "
                        "(aliases of aliases multiply: a 'billion laughs' file?)",
                    )
            else:
                continue
            if stack:
                stack[-1][0] += size
    finally:
        loader.dispose()


def load_text(text: str, filename: str) -> Document:
    """Parse YAML text into a Document; raise YamlError with positions."""
    text = _pasted_marker(text)
    try:
        _check_budgets(text)
        root = yaml.compose(text, Loader=_LOADER)
    except _Refused as exc:
        line, col = (exc.mark.line + 1, exc.mark.column + 1)
        raise YamlError([Problem(filename, line, col, "yaml", exc.message)]) from None
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
        value = constructor.construct_object(node, deep=True)
        # plain style is None in PyYAML's parser, "" in libyaml's
        if value is not None and not isinstance(value, str) and not node.style:
            doc.text[path] = node.value
        return value

    doc.data = build(root, ()) if root is not None else None
    doc.value_pos.pop(("<key>",), None)
    for p in [p for p in doc.value_pos if "<key>" in p]:
        del doc.value_pos[p]
    for p in [p for p in doc.text if "<key>" in p]:
        del doc.text[p]
    if problems:
        raise YamlError(problems)
    return doc
