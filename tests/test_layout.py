"""The house rules of the layout: small folders, small modules, no import cycle, imports that point down a floor."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from .conftest import REPO

FOLDERS = {"kernels": "phasebench.kernels", "bench": "phasebench.bench", "profiles": "phasebench.profiles",
           "analysis": "phasebench.analysis"}
# What each package may import of phasebench (its own modules always), lazy imports inside functions included.
# bench's floors: each sub-package imports only those on lower floors (and kernels, profiles where listed).
ALLOWED = {
    "phasebench.kernels": (),
    "phasebench.profiles": (),
    "phasebench.bench.spec": (),
    "phasebench.analysis": ("phasebench.bench.spec", "phasebench.profiles.names"),
    "phasebench.bench.instruments": ("phasebench.bench.spec", "phasebench.profiles"),
    "phasebench.bench.ops": ("phasebench.bench.spec", "phasebench.bench.instruments", "phasebench.kernels",
                             "phasebench.profiles"),
    "phasebench.bench.sweep": ("phasebench.bench.spec", "phasebench.bench.instruments", "phasebench.bench.ops",
                               "phasebench.kernels", "phasebench.profiles"),
    "phasebench.bench.phases": ("phasebench.bench.spec", "phasebench.bench.instruments", "phasebench.bench.ops",
                                "phasebench.bench.sweep", "phasebench.kernels", "phasebench.profiles",
                                "phasebench.analysis"),
    "phasebench.bench.session": ("phasebench.bench.spec", "phasebench.bench.instruments", "phasebench.bench.ops",
                                 "phasebench.bench.sweep", "phasebench.kernels", "phasebench.profiles",
                                 "phasebench.analysis"),
    "phasebench.bench.cli": ("phasebench",),  # the one place that wires everything
    "phasebench.bench": ("phasebench",),  # the contract shims and the pytest-benchmark suite
}
MAX_MODULES_PER_FOLDER = 10
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    found = {}
    for folder, package in FOLDERS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = path.relative_to(REPO / folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            found[".".join((package, *parts))] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path, *, top_level_only: bool) -> set[str]:
    """The phasebench modules `name` imports (a `from package import submodule` counts as the submodule); with
    `top_level_only` those its import runs (not inside functions, classes or `if TYPE_CHECKING:`), else every one,
    the lazy imports inside functions and methods included."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    nodes = list(ast.walk(tree))
    if top_level_only:  # module-level statements, inside try/if blocks too, but not `if TYPE_CHECKING:`
        nodes = [n for stmt in tree.body for n in ast.walk(stmt)
                 if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                 and not (isinstance(stmt, ast.If) and "TYPE_CHECKING" in ast.unparse(stmt.test))]
    out = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("phasebench"):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if sub in MODULES else target)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("phasebench"))
    return {m for m in out if m in MODULES and m != name}


def _owner(name: str) -> str:
    """The most specific package of ALLOWED that holds `name`."""
    return max((p for p in ALLOWED if name == p or name.startswith(p + ".")), key=len)


def test_every_import_points_down_a_floor():
    bad = []
    for name, path in MODULES.items():
        owner = _owner(name)
        for target in _imports(name, path, top_level_only=False):
            ok = target.startswith(owner + ".") or target == owner or any(
                target == a or target.startswith(a + ".") for a in ALLOWED[owner])
            if not ok:
                bad.append(f"{name} imports {target}")
    assert not bad, "\n".join(bad)


def _package(name: str) -> str:
    """The package that holds module `name` (a package's __init__ is its own package)."""
    path = MODULES[name]
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _graph(*, top_level_only: bool, level=lambda name: name) -> dict[str, set[str]]:
    """Who imports whom, each module seen as `level(module)`. A package's __init__ is imported before its
    submodules, so importing an enclosing package (`from .. import X`) is no cycle and is left out."""
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        node = level(name)
        targets = {level(t) for t in _imports(name, path, top_level_only=top_level_only)
                   if not name.startswith(t + ".")}
        graph.setdefault(node, set()).update(t for t in targets if t != node and not node.startswith(t + "."))
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected part of `graph` that has more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    parts: list[set[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            part = set()
            while True:
                member = stack.pop()
                part.add(member)
                if member == node:
                    break
            if len(part) > 1:
                parts.append(part)

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return [_loop(graph, part) for part in parts]


def _loop(graph: dict[str, set[str]], part: set[str]) -> list[str]:
    """The shortest way from the part's first node back to itself, through the part only (breadth first)."""
    start = min(part)
    trails, frontier = {start: [start]}, [start]
    while frontier:
        step = []
        for node in frontier:
            for nxt in sorted(graph[node] & part):
                if nxt == start:
                    return trails[node] + [start]
                if nxt not in trails:
                    trails[nxt] = trails[node] + [nxt]
                    step.append(nxt)
        frontier = step
    raise AssertionError(f"no loop through {sorted(part)}")  # a strongly connected part always has one


def _described(cycles: list[list[str]]) -> str:
    return "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_cycle_finder_finds_lazy_and_package_cycles():
    """The finder itself: a cycle of three, a two-node one beside it, none in a chain."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": {"a"}}
    assert sorted(map(tuple, _cycles(graph))) == [("a", "b", "c", "a"), ("d", "e", "d")]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_cycle_at_module_level():
    """Modules that import each other when imported (the kind Python fails on)."""
    cycles = _cycles(_graph(top_level_only=True))
    assert not cycles, _described(cycles)


def test_no_import_cycle_lazy_imports_included():
    """A lazy import inside a function still ties two modules together: none may close a cycle."""
    cycles = _cycles(_graph(top_level_only=False))
    assert not cycles, _described(cycles)


def test_no_import_cycle_between_packages():
    """Nor may packages (bench.sweep, analysis.report, ...) import each other through any of their modules."""
    cycles = _cycles(_graph(top_level_only=False, level=_package))
    assert not cycles, _described(cycles)


@pytest.mark.parametrize("folder", sorted(FOLDERS))
def test_no_folder_holds_more_than_about_ten_modules(folder):
    crowded = {}
    for directory in [REPO / folder, *(p for p in (REPO / folder).rglob("*") if p.is_dir())]:
        if directory.name == "__pycache__":
            continue
        modules = [p for p in directory.glob("*.py") if p.name != "__init__.py"]
        if len(modules) > MAX_MODULES_PER_FOLDER:
            crowded[str(directory.relative_to(REPO))] = len(modules)
    assert not crowded, crowded


def test_every_package_says_what_it_holds_and_every_module_stays_small():
    missing = [str(p.relative_to(REPO)) for p in MODULES.values() if not ast.get_docstring(ast.parse(p.read_text()))
               and p.read_text().strip()]
    long = {str(p.relative_to(REPO)): n for p in MODULES.values() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not missing, f"modules without a docstring: {missing}"
    assert not long, f"modules past {MAX_LINES} lines: {long}"



def test_every_package_is_in_the_wheel():
    """pyproject lists each package by name (package-dir maps the four folders): one left out is missing from a
    wheel, though an editable install still finds it."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11+")
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    packages = {name for name, path in MODULES.items() if path.name == "__init__.py"}
    assert packages == listed, {"not listed": sorted(packages - listed), "no such package": sorted(listed - packages)}
