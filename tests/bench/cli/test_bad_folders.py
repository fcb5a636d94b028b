"""The verbs that read folders (compare, report, merge) answer a folder that is not what they read in one line, never
a traceback: unrelated JSON (other pytest-benchmark suites among it), results files that are not files, run.json and
shard.json that do not read as ours."""

from __future__ import annotations

import json
import shutil

import pytest
from phasebench.analysis import load
from phasebench.analysis.loading.results import DataFileError
from phasebench.bench.cli.main import main

from ...conftest import REPO

RUN = REPO / "analysis" / "sample" / "cpu-quick"
PYTEST_BENCHMARK = {"machine_info": {"cpu": {"brand_raw": "x"}}, "commit_info": {}, "datetime": "2026-01-01"}


def unrelated_json(folder):
    (folder / "package.json").write_text(json.dumps({"name": "left-pad", "version": "1.3.0"}))
    (folder / "numbers.json").write_text("[1, 2, 3]")
    (folder / "broken.json").write_text("{not json")
    # pytest-benchmark files of another suite, and one whose entries and machine_info are not objects
    other = {**PYTEST_BENCHMARK, "benchmarks": [{"name": "test_sort", "extra_info": {}, "stats": {"median": 1.0}}]}
    (folder / "other_suite.json").write_text(json.dumps(other))
    (folder / "odd.json").write_text(json.dumps({"machine_info": "a string", "benchmarks": [1, 2]}))


def results_csv_folder(folder):
    (folder / "run" / "results.csv").mkdir(parents=True)  # a folder where a results file would be


def run_json_not_ours(folder):
    shutil.copytree(RUN, folder / "run")
    (folder / "run" / "run.json").write_text(json.dumps({"schema": 1, "device": "a string"}))


def ours_malformed(folder):
    entry = {"name": "t", "extra_info": {"impl": "naive", "op": "attention"}, "stats": {"median": 0.001}}
    (folder / "bench.json").write_text(json.dumps({**PYTEST_BENCHMARK, "machine_info": "x", "benchmarks": [entry]}))


@pytest.mark.parametrize("make, says", [
    (unrelated_json, "no results.parquet, results.csv or pytest-benchmark JSON found in this folder"),
    (results_csv_folder, "no results.parquet, results.csv or pytest-benchmark JSON found in this folder"),
    (run_json_not_ours, "run.json: 'device' must be an object"),
    (ours_malformed, "bench.json: extra_info lacks field(s)"),
])
@pytest.mark.parametrize("verb", ["compare", "report"])
def test_a_folder_that_holds_no_results_of_ours_gets_one_line(make, says, verb, tmp_path, capsys):
    folder = tmp_path / "given"
    folder.mkdir()
    make(folder)
    argv = ["compare", str(RUN), str(folder)] if verb == "compare" else ["report", str(folder), "--out",
                                                                           str(tmp_path / "report")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"phasebench {verb}: error: ") and says in err and len(err.splitlines()) == 1, err
    with pytest.raises((DataFileError, ValueError)) as raised:  # the loader's own one-line error, of a ValueError
        load(folder)
    assert "\n" not in str(raised.value)


def test_unrelated_json_beside_a_run_is_ignored(tmp_path):
    shutil.copytree(RUN, tmp_path / "run")
    unrelated_json(tmp_path)
    assert len(load(tmp_path)) == len(load(RUN))


@pytest.mark.parametrize("shard_json, run_json, says", [
    ("[1]", None, "is not a shard folder (no readable shard.json)"),
    ({"shard": "x", "of": "y"}, None, "is not a shard folder (no readable shard.json)"),
    ({"shard": 3, "of": 2}, None, "is not a shard folder (no readable shard.json)"),
    ({}, "[2]", "its rows cannot be read (IsADirectoryError"),
])
def test_merge_of_a_folder_that_is_not_a_shard_gets_one_line(shard_json, run_json, says, tmp_path, capsys):
    folder = tmp_path / "shard"
    folder.mkdir()
    info = {"sweep_id": "abc", "shard": 1, "of": 1, "cases": 1, "rows": 1, "sweep_cases": 1, "sweep_rows": 1,
            "suite": "quick", "impls": ["naive"], "options": {}}
    text = shard_json if isinstance(shard_json, str) else json.dumps({**info, **shard_json})
    (folder / "shard.json").write_text(text)
    if run_json is not None:
        (folder / "run.json").write_text(run_json)
        (folder / "results.csv").mkdir()
    assert main(["merge", str(folder), "--partial", "--out", str(tmp_path / "merged")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("phasebench merge: error: shards: ") and says in err and len(err.splitlines()) == 1, err
