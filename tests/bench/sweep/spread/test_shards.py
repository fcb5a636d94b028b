"""Sweeps split by case: every (case, impl) in exactly one shard, merged back to the one-process set, mixes refused."""

from __future__ import annotations

import csv
import json
import os
import random
import subprocess
import sys

import pytest
from phasebench.analysis import load
from phasebench.bench.cli.main import main
from phasebench.bench.sweep.results import sample_key
from phasebench.bench.sweep.runner import impls_for
from phasebench.bench.sweep.spread import shards
from phasebench.bench.sweep.suites import suite_cases

from ....conftest import REPO

# three tiny float32 cases (a prefill, a decode, a chunk), as `phasebench run --shape` takes them
SHAPES = ["batch=1,q_heads=4,kv_heads=2,q_len=17,kv_len=17,head_dim=24",
          "batch=3,q_heads=6,kv_heads=2,q_len=1,kv_len=45,head_dim=24",
          "batch=1,q_heads=2,kv_heads=1,q_len=5,kv_len=29,head_dim=24"]
IMPLS = ["naive", "flash"]
OPTIONS = {"device": "cpu", "triton_mode": "interpreter", "timer": {"budget_s": 0.3}, "profiled": False}


def selection(*extra: str) -> list[str]:
    argv = ["--impl", *IMPLS]
    for shape in SHAPES:
        argv += ["--shape", shape]
    return [*argv, *extra]


def keys(folder) -> list[tuple]:
    with (folder / "results.csv").open(newline="") as fh:
        return [sample_key(row) for row in csv.DictReader(fh)]


def pairs(cases, impls) -> list[tuple]:
    return [(repr(c), i) for c in cases for i in impls_for(c, impls)]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """The same three-case sweep run in one process and as shards 1/2 and 2/2 (CLI in this process)."""
    root = tmp_path_factory.mktemp("sweep")
    for name, extra in (("single", ()), ("s1", ("--shard", "1/2")), ("s2", ("--shard", "2/2"))):
        assert main(["run", *selection(*extra), "--out", str(root / name)]) == 0
    return root


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_shards_hold_each_case_and_impl_once_with_a_case_in_one_shard(n):
    suites = ("quick", "decode", "decode-linear", "ragged")
    cases = [c for suite in suites for c in suite_cases(suite, "cuda", "bfloat16")]
    assert len(set(cases)) < len(cases)  # quick and decode share cases: a case named twice goes to one shard
    shard_of = dict(zip(cases, shards.assign(cases, n, ["naive"]), strict=True))
    assert all(shard_of[c] == s for c, s in zip(cases, shards.assign(cases, n, ["naive"]), strict=True))
    cases = list(dict.fromkeys(cases))
    random.Random(n).shuffle(cases)
    impls = ["naive", "flash", "torch", "triton"]
    parts = [shards.shard_cases(cases, k, n, impls) for k in range(1, n + 1)]
    flat = [p for part in parts for p in pairs(part, impls)]
    assert sorted(flat) == sorted(pairs(cases, impls)) and len(set(flat)) == len(flat)
    for part in parts:  # in the sweep's order, and no case split across shards
        assert part == [c for c in cases if c in set(part)]
    rows = [sum(len(impls_for(c, impls)) for c in part) for part in parts]
    heaviest = max(len(impls_for(c, impls)) for c in cases)
    assert max(rows) - min(rows) <= heaviest  # balanced by rows to within one case
    assert parts == [shards.shard_cases(list(cases), k, n, impls) for k in range(1, n + 1)]  # deterministic


def test_the_sweep_id_is_stable_across_processes_and_changes_with_what_is_measured():
    cases = suite_cases("quick", "cpu", "float32")
    here = shards.sweep_id(cases, IMPLS, OPTIONS)
    code = ("from phasebench.bench.sweep.spread import shards; from phasebench.bench.sweep.suites import suite_cases; "
            f"print(shards.sweep_id(suite_cases('quick', 'cpu', 'float32'), {IMPLS!r}, {OPTIONS!r}))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert other.stdout.strip() == here
    assert shards.sweep_id(cases, IMPLS, {**OPTIONS, "device": "cuda:0"}) == here  # a fleet mixes devices
    assert shards.sweep_id(cases[:-1], IMPLS, OPTIONS) != here
    assert shards.sweep_id(cases, ["naive"], OPTIONS) != here
    assert shards.sweep_id(cases, IMPLS, {**OPTIONS, "triton_mode": "compiled"}) != here


@pytest.mark.parametrize("text", ["0/2", "3/2", "1/0", "a/b", "2", "-1/3", ""])
def test_a_bad_shard_spec_is_one_line(text):
    with pytest.raises(shards.ShardError, match=r"^shard: expected K/N with 1 <= K <= N \(1-based") as err:
        shards.parse_shard(text)
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_merged_shards_equal_the_single_process_run(sweep, capsys):
    s1, s2 = keys(sweep / "s1"), keys(sweep / "s2")
    assert s1 and s2 and not set(s1) & set(s2)
    case_of = {k: k[2:] for k in s1 + s2}  # the key without op and impl
    assert not {case_of[k] for k in s1} & {case_of[k] for k in s2}  # every impl of a case in one shard
    assert main(["merge", str(sweep / "s2"), str(sweep / "s1"), "--out", str(sweep / "merged")]) == 0
    assert "merged 2 of 2 shard(s)" in capsys.readouterr().out
    merged = keys(sweep / "merged")
    assert sorted(merged) == sorted(keys(sweep / "single")) and len(set(merged)) == len(merged)
    meta = json.loads((sweep / "merged" / "run.json").read_text())
    assert [s["shard"] for s in meta["shards"]] == [1, 2] and meta["sweep"]["rows"] == len(merged)
    for entry in meta["shards"]:  # each shard's own device and ceilings are kept
        assert entry["device"]["name"] and entry["ceilings"]["peak_gbps"] > 0 and entry["sweep"]["of"] == 2
    df = load(sweep / "merged")
    assert sorted(df.shard) == sorted([1] * len(s1) + [2] * len(s2))
    assert df["samples_ms"].map(lambda s: s is not None and len(s) >= 1).all()
    assert (df.device != "").all() and set(df.run_id) == {json.loads((sweep / n / "run.json").read_text())["run_id"]
                                                         for n in ("s1", "s2")}
    everything = load(sweep)  # the folder above: the merged set stands for its shards, the single run is apart
    assert len(everything) == 2 * len(merged)
    assert (load(sweep / "s1").shard == 1).all()


def merge_error(capsys, *argv) -> str:
    assert main(["merge", *map(str, argv)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err


@pytest.mark.slow
def test_merge_refuses_shards_of_different_sweeps_missing_twice_or_unfinished(sweep, tmp_path, capsys):
    other = tmp_path / "other"
    assert main(["run", "--impl", "naive", "--shape", SHAPES[0], "--shard", "2/2", "--out", str(other)]) == 2
    assert "holds no cases" in capsys.readouterr().err  # one case cannot make two shards
    assert main(["run", "--impl", "naive", "--shape", SHAPES[0], "--shape", SHAPES[1], "--shard", "2/2",
                 "--out", str(other)]) == 0
    capsys.readouterr()
    out = tmp_path / "m"
    assert "shards of different sweeps do not merge" in merge_error(capsys, sweep / "s1", other, "--out", out)
    assert "given twice" in merge_error(capsys, sweep / "s1", sweep / "s1", "--out", out)
    assert "shard(s) 2/2 of sweep" in merge_error(capsys, sweep / "s1", "--out", out)
    assert "not a shard folder" in merge_error(capsys, sweep / "s1", sweep / "single", "--out", out)
    torn = tmp_path / "torn"
    torn.mkdir()
    for name in ("shard.json", "run.json", "results.csv"):
        (torn / name).write_bytes((sweep / "s2" / name).read_bytes())
    lines = (torn / "results.csv").read_text().splitlines()
    (torn / "results.csv").write_text("\n".join(lines[:-1]) + "\n")
    err = merge_error(capsys, sweep / "s1", torn, "--out", out)
    assert "is unfinished" in err and "--shard 2/2 --resume --out" in err
    twice = (sweep / "s1" / "results.csv").read_text().splitlines()[1]
    (torn / "results.csv").write_text("\n".join([*lines, twice]) + "\n")  # whole: a last line cut short is torn
    assert "is in shard 1/2 and in shard 2/2" in merge_error(capsys, sweep / "s1", torn, "--out", out, "--partial")
    assert main(["merge", str(sweep / "s1"), "--out", str(out), "--partial"]) == 0
    assert "2/2 missing" in capsys.readouterr().err
    assert sorted(keys(out)) == sorted(keys(sweep / "s1"))


@pytest.mark.slow
def test_a_shard_resumes_only_as_its_own_shard_of_its_own_sweep(sweep, tmp_path, capsys):
    folder = tmp_path / "s1"
    for name in ("shard.json", "run.json", "results.csv"):
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_bytes((sweep / "s1" / name).read_bytes())
    assert main(["run", *selection("--resume", "--out", str(folder))]) == 2
    assert "is a shard folder; give its --shard K/N" in capsys.readouterr().err
    assert main(["run", *selection("--shard", "2/2", "--resume", "--out", str(folder))]) == 2
    assert "holds shard 1/2 of sweep" in capsys.readouterr().err
    assert main(["run", "--impl", "naive", *selection()[3:], "--shard", "1/2", "--resume", "--out", str(folder)]) == 2
    assert "(other cases, impls or options)" in capsys.readouterr().err
    before = keys(folder)
    assert main(["run", *selection("--shard", "1/2", "--resume", "--out", str(folder))]) == 0
    assert keys(folder) == before  # complete: nothing measured again


class FakeConfig:
    def __init__(self, **options):
        self.options = {"--suite": "quick", "--impl": IMPLS, "--plugin": None, "--op": None, "--device": "cpu",
                        "--dtype": None, "--shard": None, "--warm": False, "--no-isolate": False,
                        "--case-timeout": None, **options}

    def getoption(self, name):
        return self.options[name]


def test_the_pytest_bench_grid_is_sharded_by_case(tmp_path):
    from phasebench.bench.bench_params import bench_params

    cases, impls = bench_params(FakeConfig())
    parts = [bench_params(FakeConfig(**{"--shard": f"{k}/3"}))[0] for k in (1, 2, 3)]
    assert sorted(p for part in parts for p in pairs(part, impls)) == sorted(pairs(cases, impls))
    with pytest.raises(ValueError, match="^shard: expected K/N"):
        bench_params(FakeConfig(**{"--shard": "4/3"}))
    # the option is wired into `pytest bench` through PHASEBENCH_SHARD (its default)
    collect = [sys.executable, "-m", "pytest", str(REPO / "bench"), "--collect-only", "-q", "-p", "no:cacheprovider",
               "--device", "cpu", "--impl", "naive"]
    env = {**os.environ, "PHASEBENCH_SHARD": "2/3"}
    proc = subprocess.run(collect, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    ids = [line for line in proc.stdout.splitlines() if "::test_kernel[" in line]
    assert proc.returncode == 0 and ids, proc.stdout[-2000:]
    naive_cases = bench_params(FakeConfig(**{"--impl": ["naive"]}))[0]
    assert len(ids) == len(shards.shard_cases(naive_cases, 2, 3, ["naive"])) < len(naive_cases)


@pytest.mark.parametrize("argv, message", [
    (["run", "--workers", "2"], "workers: goes with --ray"),
    (["run", "--ray", "--shard", "1/2"], "shard: --ray runs every shard"),
    (["run", "--ray", "--workers", "0"], "workers: must be at least 1, got 0"),
    (["run", "--ray", "--resume"], "resume: needs --out DIR"),
    (["run", "--shard", "3/2", "--impl", "naive"], "shard: expected K/N with 1 <= K <= N"),
])
def test_bad_shard_and_ray_command_lines_are_one_line(argv, message, tmp_path, capsys):
    assert main([*argv, "--out", str(tmp_path / "x")] if "--resume" not in argv else argv) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # the error is one line, after the sweep's summary line
    assert last.startswith("phasebench run: error: ") and message in last
