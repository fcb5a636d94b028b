"""A reader's side of a folder still being written, or left by a killed run: the whole rows of results.csv only,
why results.parquet is missing, each said in one FolderWarning (bench.spec.store.files writes the folder)."""

from __future__ import annotations

import io
import json
import warnings
from pathlib import Path

from ...bench.spec.store.files import FolderWarning, read_whole


def say(line: str) -> None:
    """One line about a folder read around a fault (the command line prints it as a note)."""
    warnings.warn(line, FolderWarning, stacklevel=3)


def csv_source(path: Path):
    """What pandas reads of a results CSV, and the line that says what was left out ("" when nothing): a
    results.csv is appended row by row, so a reader takes its whole rows only; other CSV files as they are."""
    if path.name != "results.csv":
        return path, ""
    whole, torn = read_whole(path)
    return io.BytesIO(whole), torn.line() if torn else ""


def missing_parquet(folder: Path) -> str | None:
    """Why a run folder's results.parquet is missing, where its run.json says the run did not end well; None for a
    run that finished, a merged sweep, and a folder without run.json (a CSV by hand)."""
    try:
        run = json.loads((folder / "run.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(run, dict) or "shards" in run:
        return None
    if run.get("write_error"):
        return f"its run stopped on {run['write_error']}"
    if not run.get("finished") or run.get("interrupted"):
        return "its run is still going, or was stopped before its end"
    return None
