"""What a report reads: each path given is of one kind (a run folder or results file, a phases folder, ...);
KINDS is the table that says how a kind is recognised, what it contributes and whether it is compared."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ...bench.spec.schema import conform
from ..interference.rows import load_interference
from ..loading.results import load
from ..phases.folder import META as PHASES_META
from ..phases.folder import load_phases


@dataclass(frozen=True)
class Kind:
    """A kind of source. `claims(path)` says a path is of this kind (the first kind that claims it wins);
    `read(path)` returns what its report section needs (None: nothing beyond rows); `rows`: the path's result
    rows load with `load` (a phases folder's ops/ is a run folder); `comparable`: two sources of comparable
    kinds that share measurements get a comparison section."""

    name: str
    claims: Callable[[Path], bool]
    read: Callable[[Path], object] | None = None
    rows: bool = True
    comparable: bool = False
    rows_in: str = ""  # the subfolder that holds the rows (a phases folder's ops/; its check/ repeats some of them)


def _is_phases(path: Path) -> bool:
    return (path / PHASES_META).is_file() or (path.name == PHASES_META and path.is_file())


def _is_interference(path: Path) -> bool:
    return (path / "interference.csv").is_file() or (path.name == "interference.csv" and path.is_file())


# One more kind is one more line here (and a section that reads `sources.of(kind)`), before "results".
KINDS: list[Kind] = [
    Kind("phases", _is_phases, read=load_phases, rows_in="ops"),
    Kind("interference", _is_interference, read=load_interference, rows=False),  # its rows are its own section's
    Kind("results", lambda path: True, comparable=True),  # run folders, results files, pytest-benchmark JSON
]


@dataclass
class Sources:
    """What the paths of a report hold: every result row in one frame; per kind, what `read` returned for each of
    its paths (`found`) and the paths (`paths`), in the order given."""

    rows: pd.DataFrame
    found: dict[str, list] = field(default_factory=dict)
    paths: dict[str, list[Path]] = field(default_factory=dict)

    def of(self, kind: str) -> list:
        """What the sources of one kind hold (what its `read` returned), in the order given."""
        return list(self.found.get(kind, []))

    def comparable(self) -> list[Path]:
        """The paths whose kinds take part in comparisons."""
        return [path for kind in KINDS if kind.comparable for path in self.paths.get(kind.name, [])]


def kind_of(path: Path) -> Kind:
    return next(kind for kind in KINDS if kind.claims(path))


def read_sources(*paths) -> Sources:
    """Sort the paths by kind, load every result row once, and read what each kind's section needs.
    A missing path raises FileNotFoundError; a malformed file ValueError, one line naming it."""
    sorted_paths: dict[str, list[Path]] = {}
    found: dict[str, list] = {}
    with_rows = []
    for path in map(Path, paths):
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such file or folder")
        kind = kind_of(path)
        sorted_paths.setdefault(kind.name, []).append(path)
        if kind.read is not None:
            found.setdefault(kind.name, []).append(kind.read(path))
        if kind.rows:
            folder = path.parent if path.is_file() and kind.read is not None else path
            with_rows.append(folder / kind.rows_in if kind.rows_in and (folder / kind.rows_in).is_dir() else folder)
    rows = load(*with_rows) if with_rows else conform(pd.DataFrame())  # e.g. only interference folders
    return Sources(rows=rows, found=found, paths=sorted_paths)


def comparison_of(sources: Sources, *, force: bool = False) -> tuple[pd.DataFrame | None, str]:
    """(the comparison, "") of exactly two comparable sources (analysis.comparison) when they share a measurement
    (a pair, or a row whose status changed), or always with `force`; else (None, why not). `force` with another
    number of sources, or sources compare refuses, raises ValueError."""
    from ..comparison.pairs import compare

    paths = sources.comparable()
    if len(paths) != 2:
        if force:
            raise ValueError(f"compare: needs exactly two run folders or results files, got {len(paths)}")
        return None, ""
    try:
        frame = compare(paths[0], paths[1])
    except ValueError as err:
        if force:
            raise
        return None, str(err).splitlines()[0]
    if force or frame["pairing"].isin(("pair", "status change")).any():
        return frame, ""
    return None, (f"{paths[0]} and {paths[1]} share no measurement (--compare shows the comparison anyway)")
