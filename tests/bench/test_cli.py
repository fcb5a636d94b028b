"""`phasebench run / list` end to end, and bad command lines: one line, non-zero exit, no traceback."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from phasebench.bench.cli import main
from phasebench.bench.results import COLUMNS

from ..conftest import run_cli

ISSUE_COLUMNS = ("impl backend mode phase batch q_heads kv_heads q_len kv_len head_dim causal dtype flops bytes "
                 "intensity latency_ms tflops gbps peak_tflops peak_gbps pct_roofline bound max_rel_err status reason "
                 "latency_p20_ms latency_p80_ms samples run_id time").split()


def test_quick_run_writes_rows_parquet_and_run_json(quick_run):
    csv = pd.read_csv(quick_run / "results.csv")
    parquet = pd.read_parquet(quick_run / "results.parquet")
    assert list(csv.columns) == COLUMNS and set(ISSUE_COLUMNS) <= set(csv.columns)
    assert len(csv) == len(parquet) == 12  # 4 cases x naive, flash, triton
    assert (parquet.status == "ok").all(), parquet[["impl", "status", "reason"]]
    assert set(parquet.phase) == {"prefill", "chunked_prefill", "decode"}
    assert set(parquet.impl) == {"naive", "flash", "triton"}
    triton = parquet[parquet.impl == "triton"]
    assert (triton["mode"] == "interpreter").all() and triton.backend.str.startswith("triton-").all()
    assert (parquet.max_rel_err < 1e-4).all() and (parquet.pct_roofline > 0).all()
    meta = json.loads((quick_run / "run.json").read_text())
    assert meta["schema"] == 1 and meta["run_id"] == parquet.run_id.iloc[0] and meta["finished"]
    assert {"python", "torch", "triton", "flash_attn"} <= set(meta["versions"])
    assert meta["ceilings"]["peak_gbps"] > 0 and "float32" in meta["ceilings"]["peak_tflops"]
    assert meta["device"]["kind"] == "cpu" and "run" in meta["command"]


def test_list_shows_suites_presets_and_impls(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for word in ("quick", "decode", "llama-3-70b", "gemma-2-9b", "naive", "sdpa-flash", "triton"):
        assert word in out


def test_run_by_hand_shape(tmp_path):
    proc = run_cli("run", "--impl", "naive", "flash", "--model", "qwen2.5-7b", "--shape", "q_len=1,kv_len=300,batch=3",
                   "--shape", "q_len=20,kv_len=20", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    df = pd.read_csv(tmp_path / "results.csv")
    assert len(df) == 4 and set(df.q_heads) == {28} and set(df.phase) == {"decode", "prefill"}
    assert "latency ms" in proc.stdout and "TFLOP/s" in proc.stdout and "% roof" in proc.stdout


@pytest.mark.parametrize("args,message", [
    (["run", "--suite", "huge"], "suite: unknown suite 'huge'"),
    (["run", "--model", "gpt-9"], "model: unknown model 'gpt-9'"),
    (["run", "--impl", "fastest"], "impl: unknown implementation 'fastest'"),
    (["run", "--dtype", "int4"], "dtype: unknown dtype 'int4'"),
    (["run", "--shape", "q_len=1,kv_len"], "shape: malformed 'kv_len'"),
    (["run", "--device", "cuda:7"], "device: cuda:7 does not exist here"),
    (["run", "--device", "tpu"], "device: unknown device 'tpu'"),
    (["run", "--resume"], "resume: needs --out DIR"),
    (["ceilings", "--dtype", "float8"], "dtype: unknown dtype 'float8'"),
])
def test_bad_command_lines(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_bad_command_line_prints_no_traceback():
    proc = run_cli("run", "--suite", "huge")
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr


def test_unwritable_out_is_refused_before_measuring(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    proc = run_cli("run", "--impl", "naive", "--out", str(blocker / "results"))
    assert proc.returncode == 2 and "out: cannot write to" in proc.stderr and "Traceback" not in proc.stderr


def test_resume_keeps_what_was_measured(tmp_path):
    first = run_cli("run", "--impl", "naive", "--shape", "q_len=4,kv_len=40,q_heads=2,kv_heads=1,head_dim=16",
                    "--out", str(tmp_path))
    assert first.returncode == 0, first.stderr
    before = pd.read_csv(tmp_path / "results.csv")
    second = run_cli("run", "--impl", "naive", "flash", "--shape", "q_len=4,kv_len=40,q_heads=2,kv_heads=1,head_dim=16",
                     "--out", str(tmp_path), "--resume")
    assert second.returncode == 0, second.stderr
    after = pd.read_csv(tmp_path / "results.csv")
    assert len(after) == 2 and after.iloc[0].equals(before.iloc[0])
