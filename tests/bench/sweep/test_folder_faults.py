"""A results folder under faults: a writer killed at random points (inside an append too) resumes to every row exactly
once and the folder always loads; a full disk or a read-only folder ends a run in one line with exit status 2 and the
rows before it kept; a second writer is refused; the same for shard folders and `merge`."""

from __future__ import annotations

import csv
import json
import os
import random
import subprocess
import sys
import time
import warnings

import pytest
from phasebench.analysis import load
from phasebench.bench.cli.main import main
from phasebench.bench.spec.store import files
from phasebench.bench.spec.store.files import FAULT_ENV
from phasebench.bench.spec.store.folder_lock import LOCK_NAME, read_holder
from phasebench.bench.sweep.results import ResultsStore, sample_key
from phasebench.bench.sweep.spread import shards

from ...conftest import REPO

ROWS = 12
# A writer of ROWS made-up rows (each with its samples) into a folder, resuming what is there, as the runner does;
# no torch, so a kill and a restart cost a fraction of a second.
WRITER = """
import json, sys, time
from phasebench.bench.sweep.results import ResultsStore
store = ResultsStore(sys.argv[1], resume=True)
store.write_run({"run_id": "faults", "finished": None})
for row in json.loads(open(sys.argv[2]).read()):
    if not store.is_done(row):
        store.append(row)
        time.sleep(float(sys.argv[3]))
store.write_parquet()
store.write_run({"run_id": "faults", "finished": "now"})
store.close()
"""
PHASES_MODEL = "name=tiny-lock,hidden=64,intermediate=96,layers=2,q_heads=2,kv_heads=1,head_dim=32,vocab=50"
SHAPES = ["batch=1,q_heads=4,kv_heads=2,q_len=11,kv_len=11,head_dim=16",
          "batch=2,q_heads=4,kv_heads=2,q_len=1,kv_len=37,head_dim=16"]


def planned_rows() -> list[dict]:
    """ROWS rows of decode cases at awkward lengths, each with seeded samples (whole floats never: the keys must
    join)."""
    rng = random.Random(3)
    rows = []
    for i in range(ROWS):
        samples = [rng.uniform(0.2, 3.0) for _ in range(rng.randint(5, 40))]
        rows.append({"run_id": "faults", "time": f"t{i}", "op": "attention", "impl": ("naive", "flash")[i % 2],
                     "model": "", "phase": "decode", "batch": 1 + i // 2, "q_heads": 4, "kv_heads": 2, "q_len": 1,
                     "kv_len": 97 + 31 * (i // 2), "head_dim": 48, "causal": True, "dtype": "float32",
                     "device": "cpu", "mode": "compiled", "timer": "perf_counter_ns", "status": "ok", "reason": "",
                     "latency_ms": sorted(samples)[len(samples) // 2], "samples": len(samples),
                     "samples_ms": samples})
    return rows


def write(folder, fault: str = "", pause: float = 0.0) -> subprocess.Popen:
    env = {**os.environ, FAULT_ENV: fault}
    plan = folder.parent / "plan.json"
    plan.write_text(json.dumps(planned_rows()))
    return subprocess.Popen([sys.executable, "-c", WRITER, str(folder), str(plan), str(pause)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def check_prefix(folder) -> int:
    """The folder loads (readers need no lock), and its rows are the first k planned ones, each once: returns k."""
    if not (folder / "results.csv").exists():
        return 0
    if b"\n" not in files.read_whole(folder / "results.csv")[0]:  # the first append torn, its header with it
        with pytest.raises(ValueError, match="file is empty") as raised, warnings.catch_warnings():
            warnings.simplefilter("ignore", files.FolderWarning)  # a torn row left out, when there is one
            load(folder)
        assert "\n" not in str(raised.value)
        return 0
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", files.FolderWarning)
        rows = load(folder)
    if not (folder / "results.parquet").exists():  # the run stopped before its end: said so
        assert any("no results.parquet" in str(w.message) for w in said)
    plan = [sample_key(r) for r in planned_rows()]
    got = [sample_key(r) for r in rows.to_dict("records")]
    assert got == plan[:len(got)]
    return len(got)


def kill_and_resume(folder, kills: int, seed: int, timed: bool = False) -> int:
    """Up to `kills` writers stopped at random points (half a row into results.csv or samples.jsonl, one of the next
    three rows; with `timed`, some by a SIGKILL after a random delay instead), each followed by the check, then one
    that finishes; returns how many were stopped before the rows were all written."""
    rng = random.Random(seed)
    torn = {"results.csv": 0, "samples.jsonl": 0}
    made = 0
    for _ in range(kills):
        done = check_prefix(folder)
        if done == ROWS:
            break
        made += 1
        name = rng.choice(sorted(torn))
        if timed and rng.random() < 0.5:  # a kill between rows or inside one, whichever comes: or none, in time
            proc = write(folder, pause=1.2)  # at most two rows before a kill within 2 s, on any host
            time.sleep(rng.uniform(0.3, 2.0))
            proc.kill()
            _, err = proc.communicate()
            assert proc.returncode in (0, -9), err[-2000:]
        else:
            proc = write(folder, f"tear:{name}:{rng.randint(1, min(3, ROWS - done))}")
            torn[name] += 1
            _, err = proc.communicate()
            assert proc.returncode == -9, err[-2000:]
    proc = write(folder)
    out, err = proc.communicate()
    assert proc.returncode == 0, err[-2000:]
    assert err.count("set aside in") <= 2 and all(len(line) < 400 for line in err.splitlines())
    table = load(folder)  # from results.parquet, written at the end
    plan = planned_rows()
    assert [sample_key(r) for r in table.to_dict("records")] == [sample_key(r) for r in plan]
    assert [list(s) for s in table["samples_ms"]] == [r["samples_ms"] for r in plan]
    for name in torn:  # every torn piece kept, a part of the row it cut (written again whole on resuming)
        side = folder / f"{name}.torn"
        pieces = side.read_bytes().split(b"\n")[:-1] if side.exists() else []
        assert len(pieces) <= kills and all(piece in (folder / name).read_bytes() for piece in pieces)
    assert not (folder / LOCK_NAME).exists()
    return made


def test_a_writer_killed_inside_its_appends_resumes_to_every_row_once(tmp_path):
    kill_and_resume(tmp_path / "run", kills=3, seed=5)


@pytest.mark.slow
def test_many_kills_at_random_points_lose_and_repeat_nothing(tmp_path):
    # every stop adds at most two rows (a tear within the next three, a timed kill within two), so each seed's
    # 12 rows take at least six stops, whatever the host's speed
    made = [kill_and_resume(tmp_path / f"run{seed}", kills=12, seed=seed, timed=True) for seed in range(4)]
    assert min(made) >= 6, made


def test_a_full_disk_mid_append_keeps_the_rows_before_it_and_the_store_resumes(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "_writes", {})
    monkeypatch.setenv(FAULT_ENV, "enospc:results.csv:4")
    plan = planned_rows()
    store = ResultsStore(tmp_path)
    store.write_run({"run_id": "faults", "finished": None})
    with pytest.raises(files.WriteError, match="results.csv: No space left on device"):
        for row in plan:
            store.append(row)
    store.close()
    assert not (tmp_path / LOCK_NAME).exists()
    with pytest.warns(files.FolderWarning, match="no results.parquet"):
        kept = load(tmp_path)
    assert [sample_key(r) for r in kept.to_dict("records")] == [sample_key(r) for r in plan[:3]]
    monkeypatch.setenv(FAULT_ENV, "enospc:results.parquet")
    store = ResultsStore(tmp_path, resume=True)
    for row in plan:
        if not store.is_done(row):
            store.append(row)
    with pytest.raises(files.WriteError, match="results.parquet: No space left on device"):
        store.write_parquet()
    assert len(store.write_parquet(quiet=True)) == ROWS and "results.parquet" in str(store.unwritten)
    assert sorted(p.name for p in tmp_path.iterdir() if "parquet" in p.name) == []  # no half file, no temporary
    monkeypatch.delenv(FAULT_ENV)
    store.write_parquet()
    store.close()
    table = load(tmp_path)
    assert len(table) == ROWS and [list(s) for s in table["samples_ms"]] == [r["samples_ms"] for r in plan]


def test_a_run_stopped_by_a_full_disk_is_one_line_with_status_2_and_resume_finishes_it(tmp_path, monkeypatch,
                                                                                      capsys):
    """From the command line: the second row's append fails (as on a full disk); then a kill is simulated by a half
    row appended by hand, and --resume sets it aside and measures the rest, each row once."""
    out = tmp_path / "run"
    argv = ["run", "--impl", "naive", "--shape", SHAPES[0], "--shape", SHAPES[1], "--no-isolate", "--out", str(out)]
    monkeypatch.setattr(files, "_writes", {})
    monkeypatch.setenv(FAULT_ENV, "enospc:results.csv:2")
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"phasebench run: error: cannot write {out / 'results.csv'}: No space left on device; "
                              f"the rows written before it are kept in {out}, and `--resume --out {out}`")
    assert json.loads((out / "run.json").read_text())["write_error"].endswith("No space left on device")
    assert not (out / LOCK_NAME).exists() and len(load(out)) == 1  # results.parquet of the row before it
    first = (out / "results.csv").read_bytes()
    assert first.count(b"\n") == 2  # the header and the first row
    with (out / "results.csv").open("ab") as fh:
        fh.write(first.splitlines(keepends=True)[1][:70])  # a row cut mid-write
    monkeypatch.delenv(FAULT_ENV)
    assert main([*argv, "--resume"]) == 0
    err = capsys.readouterr().err
    assert f"phasebench: {out / 'results.csv'}: a torn row (70 bytes" in err and "set aside in results.csv.torn" in err
    rows = load(out)
    assert len(rows) == 2 and rows["time"].iloc[0] == csv_rows(first)[0]["time"] and (rows.status == "ok").all()


def csv_rows(data: bytes) -> list[dict]:
    return list(csv.DictReader(data.decode().splitlines()))


HOLD = """
import sys
from phasebench.bench.spec.store import folder_lock
folder_lock.acquire(sys.argv[1], "phasebench run --impl naive --out " + sys.argv[1])
print("held", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def held(tmp_path):
    """A folder another process writes (holds its lock) for the length of a test."""
    folder = tmp_path / "held"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "held"
    yield folder, proc.pid
    proc.communicate("")


@pytest.mark.parametrize("verb", ["run", "shard", "merge", "phases", "interference", "report"])
def test_a_second_writer_is_refused_in_one_line_naming_the_holder(held, verb, tmp_path, capsys):
    """Every verb that writes a folder, before it writes anything there (each refusal comes before measuring)."""
    folder, pid = held
    argv = {"run": lambda: ["run", "--impl", "naive", "--shape", SHAPES[0], "--no-isolate", "--out", str(folder)],
            "shard": lambda: ["run", "--impl", "naive", "--shape", SHAPES[0], "--shape", SHAPES[1], "--shard", "1/2",
                              "--no-isolate", "--out", str(folder)],
            "merge": lambda: ["merge", str(shard_folders(tmp_path)[0]), "--partial", "--out", str(folder)],
            "phases": lambda: ["phases", "--model", PHASES_MODEL, "--no-isolate", "--out", str(folder)],
            "interference": lambda: ["interference", "--out", str(folder)],
            "report": lambda: ["report", str(REPO / "analysis" / "sample" / "cpu-quick"), "--out", str(folder)]}[verb]()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"phasebench {argv[0]}: error: {folder} is being written by pid {pid} ")
    assert "(phasebench run --impl naive --out" in err and "choose another folder" in err
    assert sorted(p.name for p in folder.iterdir()) == [LOCK_NAME]  # nothing written: no shard.json, no rows


TORN_ROW = b"faults,t11,cpu,cpu,custom,,attention,flash,flash,comp"


def shard_folders(root, torn: bool = False) -> list:
    """Two shard folders of a made-up sweep of the planned rows (half each), as `run --shard` leaves them: finished,
    or (`torn`) the second killed half-way into its last row."""
    plan = planned_rows()
    folders = []
    for k in (1, 2):
        folder = root / f"shard-{k}-of-2"
        part = plan[k - 1::2]
        info = shards.ShardInfo("f0ld", k, 2, len(part), len(part), ROWS, ROWS, "custom", ["naive", "flash"], {})
        shards.mark_shard(folder, info, resume=False)
        store = ResultsStore(folder)
        for row in part[:-1] if torn and k == 2 else part:
            store.append(row)
        store.write_run({"run_id": f"s{k}", "finished": None if torn and k == 2 else "yes"})
        store.write_parquet()
        store.close()
        folders.append(folder)
    if torn:
        (folders[1] / "results.parquet").unlink()
        with (folders[1] / "results.csv").open("ab") as fh:
            fh.write(TORN_ROW)  # killed mid-append
    return folders


def test_merge_takes_whole_rows_of_a_torn_shard_and_writes_its_folder_whole(tmp_path, monkeypatch, capsys):
    first, second = shard_folders(tmp_path, torn=True)
    out = tmp_path / "merged"
    assert main(["merge", str(first), str(second), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"results.csv: a torn row ({len(TORN_ROW)} bytes" in err
    assert "shard 2/2 in" in err and "unfinished (5 of 6 rows)" in err
    assert main(["merge", str(first), str(second), "--partial", "--out", str(out)]) == 0
    assert len(load(out)) == ROWS - 1
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    monkeypatch.setattr(files, "_writes", {})
    monkeypatch.setenv(FAULT_ENV, "enospc:run.json")
    assert main(["merge", str(first), str(second), "--partial", "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip().endswith(f"cannot write {out / 'run.json'}: No space left on device")
    after = {p.name: p.read_bytes() for p in out.iterdir()}
    assert after.keys() == before.keys() and after["run.json"] == before["run.json"]  # no half file, no temporary
    assert len(load(out)) == ROWS - 1


# A plugin impl that holds its first call until a file appears: a run that is surely still writing its folder.
WAITER = """
import time
from pathlib import Path
from phasebench.kernels import attention, register

def waits(q, k, v, *, causal, scale, cache_seqlens):
    for _ in range(6000):
        if Path({go!r}).exists():
            break
        time.sleep(0.1)
    return attention(q, k, v, impl="naive", causal=causal, scale=scale, cache_seqlens=cache_seqlens)

register("attention", "waits", waits, devices=("cpu",))
"""


def cli(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "phasebench.bench.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                            env={**os.environ, **(env or {})})


@pytest.mark.slow
def test_two_runs_on_one_folder_the_second_is_refused_and_the_folder_holds_the_first_only(tmp_path):
    """The issue's two writers: a second `phasebench run` on a folder that a first one is writing exits 2 in one line
    naming it, and the folder holds the first run's rows and run.json only."""
    plugin, go, out = tmp_path / "waiter.py", tmp_path / "go", tmp_path / "run"
    plugin.write_text(WAITER.format(go=str(go)))
    shapes = [arg for shape in SHAPES for arg in ("--shape", shape)]
    first = cli("run", "--plugin", str(plugin), "--impl", "naive", "waits", *shapes, "--out", str(out))
    for _ in range(3000):
        if read_holder(out) or first.poll() is not None:
            break
        time.sleep(0.1)
    assert read_holder(out)["pid"] == first.pid
    second = cli("run", "--impl", "flash", *shapes, "--out", str(out))
    _, err = second.communicate(timeout=900)
    go.write_text("")
    _, first_err = first.communicate(timeout=900)
    assert first.returncode == 0, first_err[-3000:]
    assert second.returncode == 2 and err.strip().splitlines()[-1].startswith(
        f"phasebench run: error: {out} is being written by pid {first.pid} ")
    rows = load(out)
    assert sorted(rows["impl"]) == ["naive", "naive", "waits", "waits"] and len(rows.drop_duplicates("shape")) == 2
    assert json.loads((out / "run.json").read_text())["selection"]["impls"] == ["naive", "waits"]
    assert not (out / LOCK_NAME).exists()


@pytest.mark.slow
def test_a_shard_killed_inside_an_append_resumes_as_its_shard_and_merges_whole(tmp_path):
    """`run --shard 1/2` killed half-way into its second row: the folder loads, the resume sets the torn row aside,
    takes over the dead run's lock with a note and measures the rest; the merge holds every row once."""
    shapes = [arg for shape in [*SHAPES, "batch=1,q_heads=2,kv_heads=1,q_len=5,kv_len=29,head_dim=16"]
              for arg in ("--shape", shape)]
    argv = ["run", "--impl", "naive", "flash", *shapes, "--no-isolate"]
    one, two = tmp_path / "s1", tmp_path / "s2"
    killed = cli(*argv, "--shard", "1/2", "--out", str(one), env={FAULT_ENV: "tear:results.csv:2"})
    killed.communicate(timeout=900)
    assert killed.returncode == -9 and read_holder(one)["pid"] == killed.pid
    with pytest.warns(files.FolderWarning, match="a torn row"):
        assert len(load(one)) == 1
    resumed = cli(*argv, "--shard", "1/2", "--resume", "--out", str(one))
    _, err = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, err[-3000:]
    assert f"took over the lock of pid {killed.pid}" in err and "set aside in results.csv.torn" in err
    other = cli(*argv, "--shard", "2/2", "--out", str(two))
    assert other.communicate(timeout=900) and other.returncode == 0
    assert main(["merge", str(one), str(two), "--out", str(tmp_path / "merged")]) == 0
    merged = load(tmp_path / "merged")
    assert len(merged) == 6 and (merged.status == "ok").all()
    assert len({sample_key(r) for r in merged.to_dict("records")}) == 6


def test_a_run_without_resume_keeps_the_rows_it_would_replace_beside_it(tmp_path, capsys):
    """A user who forgets --resume after a kill: the new run starts the folder afresh, the earlier rows are kept under
    names no loader reads, and one line says where."""
    plan = planned_rows()
    store = ResultsStore(tmp_path)
    for row in plan[:3]:
        store.append(row)
    store.close()
    earlier = (tmp_path / "results.csv").read_bytes()
    store = ResultsStore(tmp_path)
    store.append(plan[5])
    store.write_parquet()
    store.close()
    assert (tmp_path / "results.csv.earlier-1").read_bytes() == earlier
    assert (tmp_path / "samples.jsonl.earlier-1").is_file()
    assert "rows of an earlier run (not --resume) kept as results.csv.earlier-1" in capsys.readouterr().err
    assert [sample_key(r) for r in load(tmp_path).to_dict("records")] == [sample_key(plan[5])]
    ResultsStore(tmp_path).close()  # a second fresh start: the next name, nothing overwritten
    assert (tmp_path / "results.csv.earlier-2").is_file()
    assert (tmp_path / "results.csv.earlier-1").read_bytes() == earlier
