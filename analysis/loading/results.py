"""Load result rows from run folders, results files and pytest-benchmark JSON into one DataFrame."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

from ...bench.spec.schema import (
    LINEAR_COLUMNS,
    PROFILE_FLOAT_COLUMNS,
    PROFILE_INT_COLUMNS,
    PROFILE_REQUIRED_COLUMNS,
    PROFILE_STRING_COLUMNS,
    QLINEAR_COLUMNS,
    REQUIRED_COLUMNS,
    SCHEMA_VERSION,
    STRING_COLUMNS,
    cell_float,
    coerce_columns,
    conform,
)
from ...profiles.names import ALL_FIELDS as CASE_KEY_FIELDS
from ...profiles.names import parse_case_key  # pure Python: no torch behind it
from .partial import csv_source, missing_parquet, say
from .pytest_benchmark import benchmark_rows, derive_figures, is_pytest_benchmark

__all__ = ["DataFileError", "load", "load_profile"]

RESULTS_NAMES = ("results.parquet", "results.csv")  # preferred first
RUN_JSON = "run.json"
# What every row needs whatever its operator; the case columns depend on the op (see _missing).
_COMMON_REQUIRED = ("impl", "phase", "dtype", "latency_ms", "status")
_OP_REQUIRED = {
    "attention": tuple(name for name in REQUIRED_COLUMNS if name not in _COMMON_REQUIRED),
    "linear": LINEAR_COLUMNS,
    "qlinear": QLINEAR_COLUMNS,
    "mla": (*(name for name in REQUIRED_COLUMNS if name not in _COMMON_REQUIRED), "head_dim_v"),
}


class DataFileError(ValueError):
    """A file that cannot be loaded; the one-line message starts with the file's path."""


def load(*sources) -> pd.DataFrame:
    """One tidy frame of result rows from any mix of sources.

    A source is a path (str or os.PathLike) or a list/tuple of them:
    - a `phasebench run` folder (results.parquet, else results.csv, plus run.json), or a
      folder holding several of them, searched recursively; pytest-benchmark JSON files
      found there are read too (other JSON files are ignored);
    - a results.parquet / results.csv file (run.json is looked up beside it);
    - a pytest-benchmark JSON file (`pytest bench --benchmark-json F`).
    Profile summary tables are not result rows: `load` refuses them with a message that
    points to `load_profile`.

    Columns: those of the runner's rows (bench.spec.schema.RESULT_COLUMNS, same names and order),
    then bench.spec.schema.RUN_COLUMNS (source file, versions, git commit, datasheet ceilings for
    the row's dtype), then any extra columns the files carried. Rows of several runs, from
    several machines, are keyed by `run_id` and `device`. Files of an older schema get the
    defaults of the columns they lack (op "attention", noisy and profiled False). Rows of a
    run whose run.json says "profiled": true are marked profiled; `load` keeps them (the
    report leaves them out unless asked).
    A malformed file, or a run.json with a newer schema, raises ValueError with one line
    naming the file; a missing path raises FileNotFoundError.
    A folder being written, or one whose writer was killed, reads too: a results.csv row that a kill tore is left
    out, and results.csv is read where results.parquet is missing or torn; each is said in one FolderWarning.
    """
    paths = _flatten(sources)
    if not paths:
        raise ValueError("load() needs at least one path")
    files: dict[Path, Path] = {}  # resolved -> as given, so a file named twice is read once
    for path in paths:
        for found in _expand(path):
            files.setdefault(found.resolve(), found)
    frames = [_read_any(path) for path in files.values()]
    # Extra columns that only some files carry come out of concat as NaN: conform again.
    return conform(pd.concat(frames, ignore_index=True, sort=False))


def load_profile(*sources) -> pd.DataFrame:
    """Profile summary tables (columns key, impl, phase, ..., kernel_count, kernel_time_ns,
    wall_ns, flush_kernel_ns, launch_overhead_ns) from parquet/CSV files or folders of them, in one frame.

    Case fields missing from a table are parsed from the NVTX case key. Adds `source` and
    the times in milliseconds: kernel_time_ms, wall_ms, launch_overhead_ms.
    """
    paths = _flatten(sources)
    if not paths:
        raise ValueError("load_profile() needs at least one path")
    files: list[Path] = []
    for path in paths:
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such file or folder")
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.suffix in (".parquet", ".csv"))
            found = [p for p in found if _has_profile_columns(p)]
            if not found:
                needed = ", ".join(PROFILE_REQUIRED_COLUMNS)
                raise ValueError(f"{path}: no profile summary table (.parquet/.csv with {needed}) in this folder")
            files.extend(found)
        else:
            files.append(path)
    return pd.concat([_read_profile(path) for path in files], ignore_index=True, sort=False)


# ---------------------------------------------------------------- finding files


def _flatten(sources) -> list[Path]:
    paths: list[Path] = []
    for source in sources:
        if isinstance(source, (list, tuple)):
            paths.extend(_flatten(source))
        elif isinstance(source, (str, os.PathLike)):
            paths.append(Path(source))
        else:
            raise TypeError(f"load(): expected a path or a list of paths, got {type(source).__name__}")
    return paths


def _expand(path: Path) -> list[Path]:
    """The results files a path stands for."""
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or folder")
    if path.is_file():
        if path.name == RUN_JSON:  # a run.json names its run folder
            return _expand(path.parent)
        return [path]
    found: list[Path] = []
    folders = sorted({p.parent for name in RESULTS_NAMES for p in path.rglob(name) if p.is_file()})
    merged = {shard for folder in folders for shard in _merged_shards(folder)}
    for folder in (f for f in folders if f.resolve() not in merged):  # a merged sweep stands for its shards
        found.append(next(folder / name for name in RESULTS_NAMES if (folder / name).is_file()))
        why = missing_parquet(folder) if found[-1].name == "results.csv" else None
        if why:
            say(f"{folder}: no results.parquet ({why}): rows read from results.csv")
    found.extend(p for p in sorted(path.rglob("*.json")) if p.name != RUN_JSON and is_pytest_benchmark(p))
    if not found:
        raise ValueError(f"{path}: no results.parquet, results.csv or pytest-benchmark JSON found in this folder")
    return found


def _merged_shards(folder: Path) -> set[Path]:
    """The shard folders a `phasebench merge` folder holds the rows of (its run.json's "shards")."""
    try:
        shards = json.loads((folder / RUN_JSON).read_text()).get("shards")
    except (OSError, ValueError, AttributeError):
        return set()
    if not isinstance(shards, list):
        return set()
    return {(folder / str(s.get("dir"))).resolve() for s in shards if isinstance(s, dict) and s.get("dir")}


def _read_any(path: Path) -> pd.DataFrame:
    try:
        if path.suffix == ".json":
            return _read_pytest_benchmark(path)
        if path.suffix in (".parquet", ".csv"):
            return _read_results(path)
        raise ValueError("not a results file (expected .parquet, .csv or pytest-benchmark .json)")
    except DataFileError:
        raise
    except ValueError as error:
        message = " ".join(str(error).split())
        raise DataFileError(f"{path}: {message}") from None
    except Exception as error:  # whatever a file that is not ours makes the readers raise: one line naming it
        raise DataFileError(f"{path}: cannot be read as results ({type(error).__name__}: "
                            f"{' '.join(str(error).split())})") from None


def _read_table(path: Path) -> pd.DataFrame:
    try:
        if path.suffix == ".parquet":
            return pd.read_parquet(path)
        source, torn = csv_source(path)
        # As the runner writes it: an empty field is missing, "NA" is text; text columns stay
        # text so a run id like "20250101" is not read as a number.
        table = pd.read_csv(source, dtype={name: str for name in STRING_COLUMNS}, keep_default_na=False,
                            na_values=[""])
        table.attrs["torn"] = torn  # said once the table reads as results
        return table
    except pd.errors.EmptyDataError:
        raise ValueError("file is empty") from None
    except ValueError:
        raise
    except Exception as error:  # pyarrow and the CSV parser raise many types
        raise ValueError(f"cannot be read as {path.suffix[1:]} ({type(error).__name__}: {error})") from None


def _has_profile_columns(path: Path) -> bool:
    try:
        columns = _read_table(path).columns
    except ValueError:
        return False
    return set(PROFILE_REQUIRED_COLUMNS) <= set(columns)


# ---------------------------------------------------------------- runner output


def _read_results(path: Path) -> pd.DataFrame:
    try:
        table = _read_table(path)
    except ValueError as error:
        beside = path.with_name("results.csv")
        if path.suffix != ".parquet" or not beside.is_file():
            raise
        reason = " ".join(str(error).replace(f"'{path}'", "it").split())
        say(f"{path}: not a whole parquet file ({reason}); rows read from results.csv beside it")
        path, table = beside, _read_table(beside)
    if set(PROFILE_REQUIRED_COLUMNS) <= set(table.columns) and "latency_ms" not in table.columns:
        raise ValueError("this is a profile summary table, not result rows; read it with load_profile()")
    missing = _missing(table)
    if missing:
        raise ValueError(f"missing result column(s) {', '.join(missing)}")
    if table.attrs.get("torn"):
        say(table.attrs["torn"])
    run = _read_run_json(path.parent / RUN_JSON)
    table = conform(table)
    table["source"] = str(path)
    if run is not None:
        _merge_run(table, run)
        _merge_shards(table, run)
    if (table["run_id"] == "").any():
        table.loc[table["run_id"] == "", "run_id"] = path.parent.name
    return table


def _missing(table: pd.DataFrame) -> list[str]:
    """The required columns a table lacks: the common ones, and the case columns of each op its rows hold
    (a table without an op column holds attention rows, as schema 1 did)."""
    ops = set(table["op"].fillna("").astype(str).replace("", "attention")) if "op" in table.columns else set()
    needed = list(_COMMON_REQUIRED)
    for op in sorted(ops or {"attention"}):
        needed += [name for name in _OP_REQUIRED.get(op, ()) if name not in needed]
    return [name for name in needed if name not in table.columns]


def _read_run_json(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            run = json.load(handle)
    except ValueError as error:
        raise DataFileError(f"{path}: not valid JSON ({' '.join(str(error).split())})") from None
    if not isinstance(run, dict):
        raise DataFileError(f"{path}: expected a JSON object, got {type(run).__name__}")
    schema = run.get("schema")
    if not isinstance(schema, int) or isinstance(schema, bool):
        raise DataFileError(f"{path}: 'schema' must be an integer, got {schema!r}")
    if schema > SCHEMA_VERSION:
        raise DataFileError(
            f"{path}: schema {schema} is newer than this phasebench reads ({SCHEMA_VERSION}); update phasebench"
        )
    for key in ("device", "versions", "ceilings"):
        if run.get(key) is not None and not isinstance(run[key], dict):
            raise DataFileError(f"{path}: {key!r} must be an object")
    return run


def _fill_blank(table: pd.DataFrame, column: str, value) -> None:
    if value is None:
        return
    if column in STRING_COLUMNS:
        table.loc[table[column] == "", column] = str(value)
    else:
        table[column] = table[column].fillna(value)


def _merge_run(table: pd.DataFrame, run: dict) -> None:
    """Fill run-level columns from run.json; values already in the rows win."""
    device = run.get("device") or {}
    versions = run.get("versions") or {}
    _fill_blank(table, "run_id", run.get("run_id"))
    _fill_blank(table, "suite", run.get("suite"))
    _fill_blank(table, "device", device.get("name"))
    _fill_blank(table, "device_kind", device.get("kind"))
    for package in ("python", "torch", "triton", "flash_attn", "phasebench"):
        _fill_blank(table, f"{package}_version", versions.get(package))
    _fill_blank(table, "git_commit", run.get("git_commit"))
    if run.get("profiled") is True:
        table["profiled"] = True
    datasheet = (run.get("ceilings") or {}).get("datasheet")
    if isinstance(datasheet, dict):
        _fill_blank(table, "datasheet_name", datasheet.get("name"))
        _fill_blank(table, "datasheet_gbps", cell_float(datasheet.get("peak_gbps")))
        per_dtype = datasheet.get("peak_tflops") or {}
        if isinstance(per_dtype, dict):
            by_dtype = table["dtype"].map(lambda dtype: cell_float(per_dtype.get(dtype)))
            table["datasheet_tflops"] = table["datasheet_tflops"].fillna(by_dtype.astype(float))


def _merge_shards(table: pd.DataFrame, run: dict) -> None:
    """Per-shard provenance: a shard folder's rows get its `shard` number; in a merged sweep, each shard's
    run.json (under "shards") fills the rows of its `shard` as a run folder's would."""
    sweep = run.get("sweep")
    if isinstance(sweep, dict) and isinstance(sweep.get("shard"), int) and "shard" not in table.columns:
        table["shard"] = sweep["shard"]
    if not isinstance(run.get("shards"), list) or "shard" not in table.columns:
        return
    for entry in run["shards"]:
        mask = table["shard"] == (entry.get("shard") if isinstance(entry, dict) else None)
        if mask.any():
            part = table.loc[mask].copy()
            _merge_run(part, entry)
            table.loc[mask] = part


# ---------------------------------------------------------------- pytest-benchmark


def _read_pytest_benchmark(path: Path) -> pd.DataFrame:
    table = benchmark_rows(path)
    missing = _missing(table)
    if missing:
        raise ValueError(f"extra_info lacks field(s) {', '.join(missing)}")
    table = conform(table)
    derive_figures(table)
    table["source"] = str(path)
    return table


# ---------------------------------------------------------------- profile tables


def _read_profile(path: Path) -> pd.DataFrame:
    try:
        if path.suffix not in (".parquet", ".csv"):
            raise ValueError("expected a .parquet or .csv profile summary table")
        table = _read_table(path)
        missing = [name for name in PROFILE_REQUIRED_COLUMNS if name not in table.columns]
        if missing:
            raise ValueError(f"not a profile summary table: missing column(s) {', '.join(missing)}")
        table = _fill_from_case_key(table)
        table = coerce_columns(
            table,
            ints=PROFILE_INT_COLUMNS,
            floats=PROFILE_FLOAT_COLUMNS,
            strings=PROFILE_STRING_COLUMNS,
        )
    except ValueError as error:
        raise DataFileError(f"{path}: {' '.join(str(error).split())}") from None
    for name in PROFILE_FLOAT_COLUMNS:
        if name in table:  # older tables lack the flush columns (and used another overhead formula)
            table[name.replace("_ns", "_ms")] = table[name] / 1e6
    table["source"] = str(path)
    return table


def _fill_from_case_key(table: pd.DataFrame) -> pd.DataFrame:
    # unparsable keys leave the case fields unknown
    parsed = pd.DataFrame([parse_case_key(k) or {} for k in table["key"].astype(str)],
                          columns=list(CASE_KEY_FIELDS), index=table.index)
    out = table.copy()
    for name in parsed.columns:
        if name not in out.columns:
            out[name] = parsed[name]
        else:
            out[name] = out[name].where(out[name].notna(), parsed[name])
    return out

