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
    """The phasebench modules `name` imports (a `from package import submodule` counts as the submodule)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    nodes = tree.body if top_level_only else list(ast.walk(tree))
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


def test_no_import_cycle_at_module_level():
    graph = {name: _imports(name, path, top_level_only=True) for name, path in MODULES.items()}
    # a package's __init__ is imported before its submodules: a submodule importing its parent is no cycle
    graph = {name: {t for t in targets if not name.startswith(t + ".")} for name, targets in graph.items()}
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(node, trail):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle.extend(trail[trail.index(nxt):] + [node, nxt] if nxt in trail else [node, nxt])
                return True
            if state.get(nxt) is None and visit(nxt, trail + [node]):
                return True
        state[node] = 2
        return False

    for start in sorted(graph):
        if state.get(start) is None and visit(start, []):
            break
    assert not cycle, " -> ".join(cycle)


@pytest.mark.parametrize("folder", ["kernels", "bench"])
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

