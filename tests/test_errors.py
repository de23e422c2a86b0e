"""The package's error policy (docs/architecture.md, "Errors").

1. Every exception class netlimit defines derives from ``NetlimitError``, so a
   caller (the CLI, a door, a library user) can tell netlimit's own refusals
   from bugs with one ``except``.  The test imports every module under
   netlimit/ (generated ``*_pb2*`` aside) and walks every class that derives
   from BaseException and was defined in the package, nested ones included.
2. Every broad handler (``except Exception``, ``except BaseException``, a bare
   ``except:``, or a tuple naming one of them) carries a comment on its own line
   or the line above saying why it must be that broad.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from netlimit.errors import NetlimitError

PKG = Path(__file__).resolve().parents[1] / "netlimit"
BROAD = {"Exception", "BaseException"}
# a comment that only silences a tool says nothing about why
_TOOL = re.compile(r"^(pragma:\s*no\s*cover|noqa(:\s*[A-Z0-9, ]+)?|type:\s*ignore(\[[^\]]*\])?)\s*-?\s*")


def _module_names() -> list[str]:
    names = []
    for p in sorted(PKG.rglob("*.py")):
        if "_pb2" in p.name:
            continue
        rel = p.relative_to(PKG.parent).with_suffix("")
        names.append(".".join(rel.parts).removesuffix(".__init__"))
    return names


def _subclasses(cls: type) -> set[type]:
    seen: set[type] = set()
    todo = [cls]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in seen:
                seen.add(sub)
                todo.append(sub)
    return seen


def _defined_here(cls: type) -> bool:
    mod = cls.__module__
    return (mod == "netlimit" or mod.startswith("netlimit.")) and "_pb2" not in mod


def test_every_exception_class_derives_from_netlimit_error():
    for name in _module_names():
        importlib.import_module(name)  # an import error fails the test: no module is left unchecked
    ours = sorted(
        (c for c in _subclasses(BaseException) if _defined_here(c)), key=lambda c: (c.__module__, c.__qualname__)
    )
    assert len(ours) >= 30, f"the walk found only {len(ours)} exception classes in netlimit: is it still walking?"
    strays = [f"{c.__module__}.{c.__qualname__}{tuple(b.__name__ for b in c.__bases__)}" for c in ours]
    strays = [s for s, c in zip(strays, ours, strict=True) if not issubclass(c, NetlimitError)]
    assert not strays, (
        "these exception classes do not derive from netlimit.errors.NetlimitError "
        "(add it as the first base; keep a builtin base such as ValueError or OSError "
        "after it when existing callers catch that):\n  " + "\n  ".join(strays)
    )


def test_rebased_classes_keep_the_builtin_bases_their_callers_catch():
    from netlimit.kernel.nft.netlink import NetlinkError
    from netlimit.limit.actions import BadAddress
    from netlimit.limit.stores.resp import RespConnectionError, RespProtocolError, RespTimeoutError

    assert issubclass(NetlinkError, OSError) and NetlinkError(2, "x").errno == 2
    assert issubclass(BadAddress, ValueError)
    assert issubclass(RespConnectionError, ConnectionError)
    assert issubclass(RespProtocolError, ConnectionError)
    assert issubclass(RespTimeoutError, TimeoutError)


def _is_broad(handler: ast.ExceptHandler) -> bool:
    t = handler.type
    if t is None:
        return True
    elts = t.elts if isinstance(t, ast.Tuple) else [t]
    return any(isinstance(e, ast.Name) and e.id in BROAD for e in elts)


def _reason(line: str) -> str:
    """The words of a line's comment, tool directives (pragma, noqa, type: ignore) removed."""
    if "#" not in line:
        return ""
    return " ".join(_TOOL.sub("", p.strip()) for p in line.split("#")[1:]).strip()


def broad_excepts_without_reason(source: str) -> list[int]:
    """Line numbers of broad handlers with no comment (on their line or the one above) that says why."""
    lines = source.splitlines()
    bad = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ExceptHandler) and _is_broad(node):
            here = _reason(lines[node.lineno - 1])
            above = _reason(lines[node.lineno - 2]) if node.lineno > 1 else ""
            if len((here + " " + above).split()) < 3:
                bad.append(node.lineno)
    return sorted(bad)


def test_every_broad_except_says_why():
    bad = []
    for p in sorted(PKG.rglob("*.py")):
        if "_pb2" in p.name:
            continue
        src = p.read_text()
        lines = src.splitlines()
        bad += [f"{p.relative_to(PKG.parent)}:{n}: {lines[n - 1].strip()}" for n in broad_excepts_without_reason(src)]
    assert not bad, (
        "a broad except needs a comment (same line or the one above) saying why it must be that broad, "
        "or narrow it to what can actually be raised there:\n  " + "\n  ".join(bad)
    )


@pytest.mark.parametrize(
    "source, flagged",
    [
        ("try:\n    f()\nexcept Exception:\n    pass\n", [3]),
        ("try:\n    f()\nexcept:\n    pass\n", [3]),
        ("try:\n    f()\nexcept (OSError, BaseException) as e:\n    pass\n", [3]),
        ("try:\n    f()\nexcept Exception:  # pragma: no cover\n    pass\n", [3]),
        ("try:\n    f()\nexcept Exception:  # noqa: BLE001\n    pass\n", [3]),
        ("try:\n    f()\nexcept Exception:  # a crash in one collector must not stop the page\n    pass\n", []),
        ("try:\n    f()\n# a crash in one collector must not stop the page\nexcept Exception:\n    pass\n", []),
        ("try:\n    f()\nexcept OSError:\n    pass\n", []),
        ("try:\n    f()\nexcept Exception:  # pragma: no cover - reported, not hidden\n    pass\n", []),
    ],
)
def test_the_scan_tells_a_reason_from_its_absence(source, flagged):
    assert broad_excepts_without_reason(source) == flagged
