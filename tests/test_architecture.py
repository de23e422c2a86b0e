"""The package's import graph: every arrow points one way.

The engine (netlimit.limit) never imports a door (netlimit.sidecar, netlimit.rls,
netlimit.daemon) nor a door's libraries (aiohttp, grpc, httptools, uvloop), and no
two modules of netlimit import each other, directly or through others.  Imports
inside functions count too: a lazy import is still an arrow; so does a module
named by a string to ``importlib.import_module`` (or ``__import__``), directly or
through a loop over a tuple of names (the CLI registry's ``_LAYERS``).
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "netlimit"
ENGINE = "netlimit.limit"
DOORS = ("netlimit.sidecar", "netlimit.rls", "netlimit.daemon", "netlimit.cli", "netlimit.cliutil")
DOOR_LIBRARIES = ("aiohttp", "grpc", "grpc_health", "httptools", "uvloop", "typer")


def _modules() -> dict[str, Path]:
    mods = {}
    for p in PKG.rglob("*.py"):
        rel = p.relative_to(PKG.parent).with_suffix("")
        name = ".".join(rel.parts)
        mods[name.removesuffix(".__init__")] = p
    return mods


def _string_tuples(tree: ast.Module) -> dict[str, list[str]]:
    """Module-level ``NAME = ("a", "b", ...)`` (tuple or list of strings only)."""
    found: dict[str, list[str]] = {}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, (ast.Tuple, ast.List)):
            elts = node.value.elts
            if elts and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in elts):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Name):
                        found[t.id] = [e.value for e in elts]  # type: ignore[attr-defined]
    return found


def _dynamic_imports(tree: ast.Module) -> list[str]:
    """Modules named to ``importlib.import_module(...)`` / ``import_module(...)`` /
    ``__import__(...)``: a string literal, or a loop variable over a literal tuple of
    strings or over a module-level one (``for m in _LAYERS: import_module(m)``)."""
    tuples = _string_tuples(tree)
    loops: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.target, ast.Name):
            it = node.iter
            if isinstance(it, ast.Name) and it.id in tuples:
                loops.setdefault(node.target.id, []).extend(tuples[it.id])
            elif isinstance(it, (ast.Tuple, ast.List)):
                names = [e.value for e in it.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
                loops.setdefault(node.target.id, []).extend(names)
    found: list[str] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        f = node.func
        fname = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        if fname not in ("import_module", "__import__"):
            continue
        arg = node.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            found.append(arg.value)
        elif isinstance(arg, ast.Name):
            found += loops.get(arg.id, []) + tuples.get(arg.id, [])
    return found


def _imports(name: str, path: Path, mods: dict[str, Path]) -> tuple[set[str], set[str]]:
    """(netlimit modules, other top-level packages) that ``name`` imports."""
    return _imports_of(name, path.name == "__init__.py", path.read_text(), mods)


def _imports_of(name: str, is_pkg: bool, source: str, mods) -> tuple[set[str], set[str]]:
    inside, outside = set(), set()
    tree = ast.parse(source)
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
        for t in targets:
            if t in mods:
                if t != name:
                    inside.add(t)
            elif not t.startswith("netlimit"):
                outside.add(t.split(".")[0])
    for t in _dynamic_imports(tree):
        if t in mods:
            if t != name:
                inside.add(t)
        elif t.startswith("netlimit"):
            raise AssertionError(f"{name} imports {t!r} by name, which is no module of netlimit")
        else:
            outside.add(t.split(".")[0])
    return inside, outside


def _graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    mods = _modules()
    edges, ext = {}, {}
    for name, path in mods.items():
        edges[name], ext[name] = _imports(name, path, mods)
    return edges, ext


def test_the_engine_imports_no_door():
    edges, ext = _graph()
    bad = []
    for m in edges:
        if m == ENGINE or m.startswith(ENGINE + "."):
            bad += [f"{m} -> {t}" for t in edges[m] if t.startswith(DOORS)]
            bad += [f"{m} -> {x}" for x in ext[m] if x in DOOR_LIBRARIES]
    assert not bad, "the engine reaches into a door:\n" + "\n".join(sorted(bad))


def test_the_doors_do_not_import_each_other():
    """The gRPC door and the daemon never need the HTTP sidecar (the sidecar may host the gRPC door)."""
    edges, _ = _graph()
    bad = [
        f"{m} -> {t}"
        for m in edges
        if m.startswith(("netlimit.rls", "netlimit.daemon"))
        for t in edges[m]
        if t.startswith("netlimit.sidecar")
    ]
    assert not bad, "\n".join(bad)


def _cycles(g: dict[str, set[str]], leaf: set[str]) -> list[list[str]]:
    """The strongly connected components of ``g`` (Tarjan) holding two modules of ``leaf``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if sum(1 for m in comp if m in leaf) > 1:
                cycles.append(sorted(comp))

    for v in g:
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycles():
    edges, _ = _graph()
    # Through package __init__ modules too (``from . import x`` is an arrow to the package):
    # a component is a cycle when two modules that are not a package's __init__ are in it
    # (an __init__ that imports its children, which import it back, is only re-exporting).
    mods = _modules()
    leaf = {m for m in edges if mods[m].name != "__init__.py"}
    cycles = _cycles(edges, leaf)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


# The CLI before the shared helpers moved out of the registry: the registry loads its
# layers by name, each layer's command takes err() from the registry inside a function.
_OLD_REGISTRY = """
import importlib
_LAYERS = ("netlimit.kernel.cli", "netlimit.simulate.cli")
for _mod in _LAYERS:
    importlib.import_module(_mod).register(None)
"""
_OLD_LAYER = """
def register(app):
    def plan():
        from .. import cli as base
        base.err("x")
    def replay():
        from ..cli import err
"""


def test_string_and_lazy_imports_are_arrows():
    """The loop the old CLI had (registry -> layer by importlib, layer -> registry in a
    function body) is a cycle to the walk; an import_module literal is an arrow too."""
    mods = dict.fromkeys(("netlimit", "netlimit.cli", "netlimit.kernel.cli", "netlimit.simulate.cli"))
    edges = {
        "netlimit.cli": _imports_of("netlimit.cli", False, _OLD_REGISTRY, mods)[0],
        "netlimit.kernel.cli": _imports_of("netlimit.kernel.cli", False, _OLD_LAYER, mods)[0],
        "netlimit.simulate.cli": _imports_of("netlimit.simulate.cli", False, _OLD_LAYER, mods)[0],
    }
    assert edges["netlimit.cli"] == {"netlimit.kernel.cli", "netlimit.simulate.cli"}
    assert "netlimit.cli" in edges["netlimit.kernel.cli"]
    assert _cycles(edges, set(edges)) == [["netlimit.cli", "netlimit.kernel.cli", "netlimit.simulate.cli"]]
    direct = _imports_of("netlimit.x", False, 'import importlib\nimportlib.import_module("netlimit.cli")\n', mods)
    assert direct[0] == {"netlimit.cli"}


def test_the_registry_imports_the_layers_and_no_layer_imports_it():
    """netlimit/cli.py registers every layer's commands; the layers take what they
    share from netlimit/cliutil.py, never from the registry."""
    edges, _ = _graph()
    layers = {m for m in edges["netlimit.cli"] if m.endswith(".cli") or m == "netlimit.demo"}
    assert {"netlimit.kernel.cli", "netlimit.sidecar.cli", "netlimit.simulate.cli", "netlimit.demo"} <= layers
    back = sorted(m for m in edges if "netlimit.cli" in edges[m] and m != "netlimit.manpages")
    assert not back, "import the command registry (take the helpers from netlimit.cliutil): " + ", ".join(back)
    assert "netlimit.cliutil" in edges["netlimit.kernel.cli"]
    users = {m for m in edges if "netlimit.cliutil" in edges[m]}
    assert {"netlimit.kernel.cli", "netlimit.demo"} <= users
    strays = sorted(m for m in users if not (m.endswith(".cli") or m == "netlimit.demo"))
    assert not strays, "netlimit.cliutil is for command modules (typer, exit codes): " + ", ".join(strays)
    assert not {t for t in edges["netlimit.cliutil"] if t.endswith(".cli") or t == "netlimit.demo"}


def test_the_check_is_not_vacuous():
    """The graph sees the arrows it should (a broken walk would pass everything)."""
    edges, ext = _graph()
    assert "netlimit.limit.limiter" in edges["netlimit.rls.servicer"]
    assert "grpc" in ext["netlimit.rls.servicer"]
    assert "netlimit.limit.rules" in edges["netlimit.limit.limiter"]


# What each part of netlimit may import of netlimit's own (docs/architecture.md says the
# same in prose), besides the shared top-level helpers; a layer's CLI module (and the
# demo, which registers its command) may import the CLI frame.
SHARED = (
    "netlimit.errors",
    "netlimit.listen",
    "netlimit.watch",
    "netlimit.reload",
    "netlimit.logs",
    "netlimit.logevery",
    "netlimit.sdnotify",
    "netlimit.extras",
    "netlimit.buildinfo",
    "netlimit.statusclient",
    "netlimit.prefixes",
    "netlimit.compiled",  # setup.py reads it too: standard library only
    "netlimit.cliutil",  # the commands' helpers: only command modules import it (test_the_registry_...)
)
MAY_IMPORT = {
    "netlimit.config": set(),
    "netlimit.kernel": {"netlimit.config"},
    "netlimit.limit": {"netlimit.config"},
    "netlimit.rls": {"netlimit.limit"},
    "netlimit.bans": {"netlimit.config", "netlimit.limit"},
    "netlimit.simulate": {"netlimit.config", "netlimit.limit"},
    "netlimit.sidecar": {"netlimit.config", "netlimit.limit", "netlimit.rls", "netlimit.bans"},
    "netlimit.daemon": {"netlimit.config", "netlimit.kernel", "netlimit.bans", "netlimit.install"},
    "netlimit.install": {"netlimit.config"},
    "netlimit.top": {"netlimit.daemon"},
    "netlimit.demo": {"netlimit.config", "netlimit.kernel", "netlimit.daemon", "netlimit.install"},
}


# Single modules a part may import beyond MAY_IMPORT: the config model spells the
# backends' names in its schema by reading them from the kernel's registry (which
# imports no family, test_the_registry_imports_no_family).
ALSO_MAY_IMPORT = {"netlimit.config": {"netlimit.kernel.registry"}}


def _part(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_each_part_imports_only_what_the_architecture_allows():
    edges, _ = _graph()
    assert set(MAY_IMPORT) <= {_part(m) for m in edges}, "a part named here no longer exists"
    bad = []
    for m, targets in edges.items():
        part = _part(m)
        if part not in MAY_IMPORT:
            continue  # the shared helpers and the CLI frame themselves
        for t in targets:
            if (
                _part(t) == part
                or t in SHARED
                or _part(t) in MAY_IMPORT[part]
                or _in(t, REGISTRY_PKG)
                or t in ALSO_MAY_IMPORT.get(part, ())
            ):
                continue
            if t in ("netlimit", "netlimit.cli") and (m.endswith(".cli") or m == "netlimit.demo"):
                continue  # a layer's commands use the frame's exit codes and error printing
            bad.append(f"{m} -> {t}")
    assert not bad, "imports docs/architecture.md does not allow:\n" + "\n".join(sorted(bad))


# --- the algorithms are named once (issue 30 item 4) ----------------------------------

#: the engine's algorithm registry: a leaf every part may read (config validates
#: ``algorithm:`` with it, simulate and the benches list it)
REGISTRY_PKG = "netlimit.limit.algorithms"
BENCH = PKG.parent / "bench"


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_algorithm_registry_is_a_leaf():
    edges, _ = _graph()
    bad = [f"{m} -> {t}" for m in edges if _in(m, REGISTRY_PKG) for t in edges[m] if not _in(t, REGISTRY_PKG)]
    assert not bad, "the algorithm registry imports the rest of netlimit:\n" + "\n".join(sorted(bad))


def _name_literals(root: Path, names: frozenset[str]) -> list[str]:
    """``file:line: name`` for each string literal that is exactly an algorithm's name."""
    out = []
    for p in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                out.append(f"{p.relative_to(PKG.parent)}:{node.lineno}: {node.value!r}")
    return out


def test_algorithm_names_are_written_only_in_the_registry():
    """Adding an algorithm is one engine module (+ its Lua script and conformance cases):
    outside netlimit/limit/algorithms/ no code writes an algorithm's name -- the config,
    the stores, simulate and the benches read REGISTRY and its constants."""
    from netlimit.limit.algorithms import REGISTRY

    names = frozenset(REGISTRY)
    assert len(names) == 6, sorted(names)
    registry_dir = PKG / "limit" / "algorithms"
    inside = _name_literals(registry_dir, names)
    assert {ln.rsplit(": ", 1)[1].strip("'") for ln in inside} == names  # the check sees them where they are
    found = [ln for ln in _name_literals(PKG, names) + _name_literals(BENCH, names) if ln not in inside]
    assert not found, "algorithm names written outside netlimit/limit/algorithms/:\n" + "\n".join(found)


# --- kernel families (netlimit/kernel/<family>/) and the one registry of their names ---

KERNEL = PKG / "kernel"
REGISTRY = "netlimit.kernel.registry"


def _families() -> list[str]:
    """Every package directly under netlimit/kernel/ is a family (nft, xtables, tc, ...)."""
    return sorted(f"netlimit.kernel.{p.parent.name}" for p in KERNEL.glob("*/__init__.py"))


def _family_of(module: str) -> str | None:
    return next((f for f in _families() if module == f or module.startswith(f + ".")), None)


def test_a_family_never_imports_another_family():
    fams = _families()
    assert {"netlimit.kernel.nft", "netlimit.kernel.xtables", "netlimit.kernel.tc"} <= set(fams)
    edges, _ = _graph()
    bad = []
    for m, targets in edges.items():
        mine = _family_of(m)
        if mine is None:
            continue
        bad += [f"{m} -> {t}" for t in targets if _family_of(t) not in (None, mine)]
    assert not bad, "a kernel family imports another family:\n" + "\n".join(sorted(bad))


def test_the_registry_imports_no_family():
    """It names each backend by where it lives and loads it on first use, so the config
    model may read the names (ALSO_MAY_IMPORT) without an arrow into the kernel's families."""
    edges, _ = _graph()
    assert edges[REGISTRY] <= {"netlimit.errors", "netlimit.kernel.objects"}, edges[REGISTRY]


def test_every_registered_backend_lives_in_a_family_and_has_the_whole_interface():
    from netlimit.kernel import registry

    wanted = [n for n in vars(registry.FilterBackend) if not n.startswith("_")]
    wanted += list(registry.FilterBackend.__annotations__)
    assert {"key", "layer", "ban_sets", "plan_sections", "rows"} <= set(wanted)
    for r in registry.REGISTERED:
        assert _family_of(r.where.split(":")[0]), f"{r.key}: {r.where} is not in a family folder"
        b = registry.backend(r.key)
        assert b.key == r.key
        missing = [n for n in wanted if not hasattr(b, n)]
        assert not missing, f"{r.key} lacks {missing}"


def _name_compares(tree: ast.AST, names: set[str]) -> list[int]:
    """Lines where a Compare tests against one of `names` (== "nftables", in ("restore", ...))."""

    def consts(node: ast.AST) -> list[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return [c for e in node.elts for c in consts(e)]
        return []

    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            if any(c in names for side in [node.left, *node.comparators] for c in consts(side)):
                out.append(node.lineno)
        elif isinstance(node, ast.Match):
            pats = [n for c in node.cases for n in ast.walk(c.pattern) if isinstance(n, ast.MatchValue)]
            out += [p.lineno for p in pats if any(c in names for c in consts(p.value))]
    return out


def test_no_code_outside_the_families_and_the_registry_compares_a_backend_name():
    """What differs between backends is an attribute or method of the backend
    (registry.FilterBackend), never `if backend == "nftables"` in the rest of netlimit."""
    from netlimit.kernel.registry import BACKENDS

    names = set(BACKENDS)
    bad = []
    for m, path in _modules().items():
        if m == REGISTRY or _family_of(m) is not None:
            continue
        bad += [f"{path.relative_to(PKG.parent)}:{n}" for n in _name_compares(ast.parse(path.read_text()), names)]
    assert not bad, "backend names compared outside netlimit/kernel/<family>/ and registry.py:\n" + "\n".join(bad)


def test_the_name_check_sees_what_it_should():
    names = {"nftables", "restore"}
    tree = ast.parse(
        'if b == "nftables": pass\n'
        'x = 1 if "restore" != k else 2\n'
        'y = k in ("restore", "python-iptables")\n'
        'match k:\n    case "nftables": pass\n'
        'z = k == "tc" or layer == "iptables"\n'
    )
    assert sorted(_name_compares(tree, names)) == [1, 2, 3, 5]


# --- rooms a person can read (issue 30 item 6) ------------------------------------------

MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 100


def _own_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """A function's lines without the functions and classes defined inside it (each is
    measured on its own)."""
    inner = [
        c for c in ast.walk(fn) if c is not fn and isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    ]
    # nested definitions inside nested ones are inside the outer nested one's span: count the outermost only
    spans = sorted((c.lineno, c.end_lineno or c.lineno) for c in inner)
    covered, last = 0, 0
    for a, b in spans:
        if a > last:
            covered += b - a + 1
            last = b
        elif b > last:
            covered += b - last
            last = b
    return (fn.end_lineno or fn.lineno) - fn.lineno + 1 - covered


def test_no_file_over_800_lines_and_no_function_over_100_lines_of_its_own():
    big, long = [], []
    for p in sorted(PKG.rglob("*.py")):
        if "_pb2" in p.name:  # generated protobuf
            continue
        text = p.read_text()
        rel = p.relative_to(PKG.parent)
        if (n := len(text.splitlines())) > MAX_FILE_LINES:
            big.append(f"{rel}: {n} lines")
        for node in ast.walk(ast.parse(text)):
            if (
                isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                and (n := _own_lines(node)) > MAX_FUNCTION_LINES
            ):
                long.append(f"{rel}:{node.lineno} {node.name}: {n} lines")
    assert not big and not long, (
        f"split along the seams (files <= {MAX_FILE_LINES} lines, functions <= {MAX_FUNCTION_LINES} of their own):\n"
        + "\n".join(big + long)
    )


def test_the_length_check_sees_what_it_should():
    src = "def f():\n" + "    x = 1\n" * 120 + "    def g():\n" + "        y = 2\n" * 50 + "    return x\n"
    fn = ast.parse(src).body[0]
    assert isinstance(fn, ast.FunctionDef)
    assert _own_lines(fn) == 1 + 120 + 1  # def line, its body, return; g's 51 lines are g's own
