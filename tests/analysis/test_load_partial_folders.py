"""A folder being written, or left by a killed run, reads: the loader takes results.csv where results.parquet is
missing or torn and a reader's whole rows only, changes nothing on disk, and says so in one line (a FolderWarning;
the command line prints it as a note)."""

from __future__ import annotations

import json
import shutil
import warnings

import pandas as pd
import pytest
from phasebench.analysis import load
from phasebench.bench.cli.main import main
from phasebench.bench.spec.store.files import FolderWarning

from ..conftest import REPO

RUN = REPO / "analysis" / "sample" / "cpu-quick"


@pytest.fixture
def run(tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(RUN, folder)
    return folder


def same_rows(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    columns = ["impl", "shape", "dtype", "latency_ms", "status"]
    return a[columns].reset_index(drop=True).equals(b[columns].reset_index(drop=True))


def test_a_torn_parquet_is_read_from_the_csv_beside_it(run):
    whole = load(run)
    data = (run / "results.parquet").read_bytes()
    (run / "results.parquet").write_bytes(data[: len(data) // 3])  # what a full disk left before this version
    with pytest.warns(FolderWarning, match=r"results.parquet: not a whole parquet file \(.*\); rows read from "
                                           "results.csv beside it"):
        read = load(run)
    assert same_rows(read, whole) and set(read["source"]) == {str(run / "results.csv")}


def test_a_missing_parquet_is_said_and_a_torn_csv_row_left_out_without_touching_the_file(run):
    whole = load(run)
    (run / "results.parquet").unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FolderWarning)  # a finished run's CSV alone (by hand, copied): nothing to say
        assert same_rows(load(run), whole)
    meta = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**meta, "finished": None}))  # killed mid-run
    lines = (run / "results.csv").read_bytes().splitlines(keepends=True)
    torn = b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2]
    (run / "results.csv").write_bytes(torn)
    with pytest.warns(FolderWarning) as said:
        read = load(run)
    messages = [str(w.message) for w in said]
    assert any("no results.parquet (its run is still going, or was stopped before its end)" in m for m in messages)
    assert any(f"a torn row ({len(lines[-1]) // 2} bytes" in m and "left out" in m for m in messages)
    assert same_rows(read, whole.iloc[:-1]) and (run / "results.csv").read_bytes() == torn


def test_the_command_line_says_it_in_one_line_and_goes_on(run, capsys):
    data = (run / "results.parquet").read_bytes()
    (run / "results.parquet").write_bytes(data[:100])
    assert main(["compare", str(run), "--by", "impl", "--base-impl", "naive", "--new-impl", "flash"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "note:" in line]
    assert len(notes) == 1 and notes[0].startswith("phasebench compare: note: ") and "results.csv beside it" in notes[0]
