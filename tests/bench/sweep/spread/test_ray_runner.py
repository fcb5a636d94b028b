"""`phasebench run --ray` on a local Ray with two CPU workers: the merged sweep equals one process's, kills resume."""

from __future__ import annotations

import csv
import json
import os
import textwrap

import pytest
import torch
from phasebench.bench.cli.main import main
from phasebench.bench.sweep.results import sample_key
from phasebench.kernels import OPS, triton_mode

ray = pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[cluster]')")
pytestmark = pytest.mark.slow  # Ray starts a local cluster per test: minutes

SHAPES = ["batch=1,q_heads=4,kv_heads=2,q_len=13,kv_len=13,head_dim=16",
          "batch=2,q_heads=6,kv_heads=3,q_len=1,kv_len=37,head_dim=16",
          "batch=1,q_heads=2,kv_heads=2,q_len=3,kv_len=21,head_dim=16"]

# A plugin impl that SIGKILLs its worker process on the decode case, the first time only (a marker file).
KILLER = textwrap.dedent("""
    import os, signal
    from pathlib import Path
    from phasebench.kernels import attention, register

    MARKER = Path({marker!r})

    def flaky(q, k, v, *, causal, scale, cache_seqlens):
        if q.shape[2] == 1 and not MARKER.exists():
            MARKER.write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return attention(q, k, v, impl="naive", causal=causal, scale=scale, cache_seqlens=cache_seqlens)

    register("attention", "flaky", flaky, devices=("cpu",))
""")


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def selection(impls) -> list[str]:
    argv = ["--impl", *impls]
    for shape in SHAPES:
        argv += ["--shape", shape]
    return argv


def keys(folder) -> list[tuple]:
    with (folder / "results.csv").open(newline="") as fh:
        return [sample_key(row) for row in csv.DictReader(fh)]


def rows(folder) -> list[dict]:
    with (folder / "results.csv").open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_two_cpu_workers_measure_the_single_process_sweep_and_the_report_draws_it(local_ray, tmp_path, capsys):
    single, out = tmp_path / "single", tmp_path / "ray"
    assert main(["run", *selection(["naive", "flash"]), "--out", str(single)]) == 0
    assert main(["run", "--ray", "--workers", "2", *selection(["naive", "flash"]), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "in 2 shard(s) on 2 CPU worker(s)" in err and "6/6 rows" in err
    merged = keys(out)
    assert sorted(merged) == sorted(keys(single)) and len(set(merged)) == len(merged)
    meta = json.loads((out / "run.json").read_text())
    assert [s["dir"] for s in meta["shards"]] == ["shard-1-of-2", "shard-2-of-2"]
    for k in (1, 2):  # each worker measured its shard into its own folder, Triton's mode as here
        shard = json.loads((out / f"shard-{k}-of-2" / "run.json").read_text())
        assert shard["measurement"]["triton_mode"] == triton_mode.mode() and shard["sweep"]["shard"] == k
        assert shard["ceilings"]["peak_gbps"] > 0 and shard["finished"]
        worker = shard["sweep"]["worker"]  # phasebench.kernels set TRITON_INTERPRET in the worker where no CUDA
        assert worker["pid"] != os.getpid() and worker["triton_mode"] == triton_mode.mode()
        if not torch.cuda.is_available():
            assert worker["triton_interpret"] == "1" and worker["triton_mode"] == "interpreter"
    assert len({json.loads((out / f"shard-{k}-of-2" / "run.json").read_text())["run_id"] for k in (1, 2)}) == 2
    report = tmp_path / "report"
    assert main(["report", str(out), "--out", str(report)]) == 0
    assert "6 rows from 2 run(s)" in capsys.readouterr().out  # the shards were not read again beside the merge
    assert (report / "report.html").stat().st_size > 0 and list(report.glob("*.png"))


@pytest.fixture
def forget_flaky():
    yield
    OPS["attention"].pop("flaky", None)  # the driver loaded the plugin too: keep it out of other tests


def test_an_isolated_case_killed_in_a_shard_is_one_failed_row_retried_on_resume(local_ray, tmp_path, capsys,
                                                                               forget_flaky):
    plugin, marker, out = tmp_path / "killer.py", tmp_path / "killed", tmp_path / "ray"
    plugin.write_text(KILLER.format(marker=str(marker)))
    argv = ["run", "--ray", "--workers", "2", "--plugin", str(plugin), *selection(["naive", "flaky"]),
            "--out", str(out)]
    assert main(argv) == 0, capsys.readouterr().err[-3000:]  # the measuring worker died, not the Ray actor
    merged = rows(out)
    failed = [r for r in merged if r["status"] != "ok"]
    assert len(merged) == 6 and len(failed) == 1 and failed[0]["impl"] == "flaky" and failed[0]["q_len"] == "1"
    assert "SIGKILL" in failed[0]["reason"] and marker.exists()
    assert main([*argv, "--resume", "--retry-failed"]) == 0, capsys.readouterr().err[-3000:]
    assert {r["status"] for r in rows(out)} == {"ok"} and len(rows(out)) == 6


def test_a_worker_killed_mid_shard_is_resumed_and_nothing_is_lost_or_repeated(local_ray, tmp_path, capsys,
                                                                               forget_flaky):
    plugin, marker, out = tmp_path / "killer.py", tmp_path / "killed", tmp_path / "ray"
    plugin.write_text(KILLER.format(marker=str(marker)))
    argv = ["run", "--ray", "--workers", "2", "--plugin", str(plugin), *selection(["naive", "flaky"]),
            "--out", str(out), "--no-isolate"]  # measured in the Ray actor itself: the kill takes the actor
    status = main(argv)
    err = capsys.readouterr().err
    assert status == 1, err[-3000:]
    assert marker.exists() and "failed" in err and "--ray --resume --out" in err
    assert not (out / "results.csv").exists()  # nothing merged from an unfinished sweep
    folders = sorted(out.glob("shard-*-of-2"))
    before = {f.name: rows(f) for f in folders}
    killed = [f for f in folders if json.loads((f / "run.json").read_text())["finished"] is None]
    planned = json.loads((killed[0] / "shard.json").read_text())["rows"] if killed else 0
    assert len(killed) == 1 and 0 < len(before[killed[0].name]) < planned
    run_ids = {f.name: json.loads((f / "run.json").read_text())["run_id"] for f in folders}
    assert main(["run", "--ray", "--workers", "2", "--plugin", str(plugin), *selection(["naive", "flaky"]),
                 "--out", str(out)]) == 2  # without --resume the shards are not overwritten
    assert "give --resume" in capsys.readouterr().err
    status = main([*argv, "--resume"])
    err = capsys.readouterr().err
    assert status == 0 and "(1 already complete)" in err, err[-3000:]
    merged = rows(out)
    assert len(merged) == 6 and {r["status"] for r in merged} == {"ok"} and {r["impl"] for r in merged} == {"naive",
                                                                                                       "flaky"}
    assert len({sample_key(r) for r in merged}) == 6
    for f in folders:  # rows measured before the kill are kept as they were, in the same run
        assert [r["time"] for r in rows(f)][: len(before[f.name])] == [r["time"] for r in before[f.name]]
        assert json.loads((f / "run.json").read_text())["run_id"] == run_ids[f.name]


# A plugin that arms the store's tear hook in the first Ray actor to import it (never in the driver): that actor
# dies half-way into the second row it appends to its shard's results.csv.
TEARER = textwrap.dedent("""
    import os
    if os.getpid() != {driver}:
        try:
            os.close(os.open({marker!r}, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            os.environ["PHASEBENCH_FAULT"] = "tear:results.csv:2"
        except FileExistsError:
            pass
""")


def test_an_actor_killed_inside_an_append_leaves_its_shard_to_resume_whole(local_ray, tmp_path, capsys):
    plugin, marker, out = tmp_path / "tearer.py", tmp_path / "armed", tmp_path / "ray"
    plugin.write_text(TEARER.format(driver=os.getpid(), marker=str(marker)))
    argv = ["run", "--ray", "--workers", "2", "--plugin", str(plugin), *selection(["naive", "flash"]),
            "--out", str(out)]
    assert main(argv) == 1, capsys.readouterr().err[-3000:]
    assert marker.exists() and not (out / "results.csv").exists()
    status = main([*argv, "--resume"])
    err = capsys.readouterr().err
    assert status == 0, err[-3000:]
    torn = sorted(out.glob("shard-*-of-2/results.csv.torn"))
    assert len(torn) == 1 and torn[0].read_bytes().count(b"\n") == 1  # the half row, kept aside
    merged = rows(out)
    assert len(merged) == 6 and len({sample_key(r) for r in merged}) == 6 and {r["status"] for r in merged} == {"ok"}
    assert not list(out.rglob("phasebench.lock"))  # every holder let go, the dead actor's lock taken over


def test_a_ray_address_where_no_cluster_answers_fails_at_once_in_one_line(tmp_path):
    from ....conftest import run_cli

    # the probe's refusal, before Ray itself is asked (it retries for minutes); a hang fails at the timeout
    proc = run_cli("run", "--ray", "127.0.0.1:1", "--workers", "1", "--out", str(tmp_path / "o"), timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr[-2000:]
    assert "no Ray cluster answers at 127.0.0.1:1" in proc.stderr and "ray start --head" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_ray_addresses_name_the_head_to_probe():
    from phasebench.bench.sweep.spread.ray_runner import head_endpoint

    assert head_endpoint("10.0.0.5:6380") == ("10.0.0.5", 6380)
    assert head_endpoint("ray://head.example:10002") == ("head.example", 10002)
    assert head_endpoint("ray://head.example") == ("head.example", 10001)
    assert head_endpoint("head.example") == ("head.example", 6379) and head_endpoint("auto") is None
