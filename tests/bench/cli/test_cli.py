"""`phasebench run / list` end to end, and bad command lines: one line, non-zero exit, no traceback."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pandas as pd
import pytest
from phasebench.bench.cli.main import main
from phasebench.bench.sweep.results import COLUMNS, SCHEMA_VERSION
from phasebench.bench.sweep.selection import default_dtype, resolve_device
from phasebench.bench.sweep.suites import suite_cases
from phasebench.kernels import OPS, available_impls, triton_mode

from ...conftest import run_cli

ISSUE_COLUMNS = ("impl backend mode phase batch q_heads kv_heads q_len kv_len head_dim causal dtype flops bytes "
                 "intensity latency_ms tflops gbps peak_tflops peak_gbps pct_roofline bound max_rel_err status reason "
                 "latency_p20_ms latency_p80_ms samples run_id time").split()


def test_list_shows_suites_presets_and_impls(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for word in ("quick", "decode", "llama-3-70b", "gemma-2-9b", "naive", "sdpa-flash", "triton"):
        assert word in out
    served = {line.split()[0]: line for line in out.splitlines() if "served:" in line}
    assert set(served) == {"deepseek-v3", "gpt-oss-20b", "gpt-oss-120b"}
    assert served["gpt-oss-20b"].endswith("served: experts mxfp4")


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
    (["run", "--retry-failed", "--out", "x"], "retry-failed: goes with --resume"),
    (["run", "--plugin", "no_such_module_here"], "plugin: cannot import 'no_such_module_here': ModuleNotFoundError"),
    (["ceilings", "--dtype", "float8"], "dtype: unknown dtype 'float8'"),
    (["run", "--shape", "q_len=1,kv_len=64,q_heads=2,kv_heads=1,head_dim=8,page=-16"],
     "page_size: must be a non-negative int"),
    (["phases", "--page-size", "-16", "--out", "x"], "page-size: must be a non-negative number of tokens"),
    (["phases", "--weights", "int4-g128", "--reference", "transformers", "--out", "x"],
     "reference: transformers' models have unquantized weights"),
    (["phases", "--model", "gpt-oss-20b", "--impl", "attention=cudnn", "--out", "x"],
     "impl: attention=cudnn cannot serve gpt-oss-20b's sliding-window layers with sinks on "),
    (["phases", "--model", "gpt-oss-20b", "--speculate", "--out", "x"],
     "speculate: the speculative loop runs GQA decoders; gpt-oss-20b has WINDOW attention"),
    (["run", "--suite", "moe-decode", "--model", "llama-3-8b"], "model: llama-3-8b is dense"),
])
def test_bad_command_lines(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_model_whose_attention_the_chosen_impl_cannot_serve_is_refused_before_measuring(capsys):
    """A plugin registered without window=True or sinks=True composes no gpt-oss window layer: one line, exit 2."""
    from phasebench.kernels import OPS, attention, register

    register("attention", "plain_only", lambda q, k, v, **kw: attention(q, k, v, impl="naive", **kw))
    try:
        assert main(["phases", "--model", "gpt-oss-20b", "--impl", "attention=plain_only", "--out", "x"]) == 2
    finally:
        OPS["attention"].pop("plain_only")
    err = capsys.readouterr().err.strip()
    assert "impl: attention=plain_only cannot serve gpt-oss-20b's sliding-window layers with sinks on " in err
    assert "has no attention-sink term" in err and "\n" not in err


def test_a_bad_command_line_prints_no_traceback():
    proc = run_cli("run", "--suite", "huge")
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr


def test_unwritable_out_is_refused_before_measuring(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    proc = run_cli("run", "--impl", "naive", "--out", str(blocker / "results"))
    assert proc.returncode == 2 and "out: cannot write to" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
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


PLUGIN = """
from phasebench.kernels import attention, register


def doubled_scale(q, k, v, *, causal, scale, cache_seqlens):
    return attention(q, k, v, impl="naive", causal=causal, scale=2 * scale, cache_seqlens=cache_seqlens)


def mine(q, k, v, *, causal, scale, cache_seqlens):
    return attention(q, k, v, impl="naive", causal=causal, scale=scale, cache_seqlens=cache_seqlens)


register("attention", "mine", mine, devices=("cpu", "cuda"), dtypes=("float32", "bfloat16", "float16"))
register("attention", "wrongscale", doubled_scale, devices=("cpu", "cuda"), dtypes=("float32", "bfloat16", "float16"))
"""


@pytest.mark.slow
def test_a_plugin_kernel_is_gated_and_timed_like_the_builtins(tmp_path):
    plugin = tmp_path / "my_kernels.py"
    plugin.write_text(PLUGIN)
    shape = "q_len=3,kv_len=70,q_heads=4,kv_heads=2,head_dim=16"
    proc = run_cli("run", "--plugin", str(plugin), "--impl", "naive", "mine", "wrongscale", "--shape", shape,
                   "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    df = pd.read_csv(tmp_path / "out" / "results.csv").set_index("impl")
    assert df.loc["mine", "status"] == "ok" and df.loc["mine", "backend"].startswith("plugin:")
    assert df.loc["mine", "tflops"] > 0
    assert df.loc["wrongscale", "status"] == "incorrect" and pd.isna(df.loc["wrongscale", "latency_ms"])


def test_a_plugin_that_clashes_with_a_builtin_is_refused(tmp_path):
    plugin = tmp_path / "clash.py"
    plugin.write_text("from phasebench.kernels import register\nregister('attention', 'flash', print)\n")
    proc = run_cli("run", "--plugin", str(plugin), "--impl", "naive")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "'flash' is a built-in attention implementation" in proc.stderr


@pytest.mark.slow
def test_a_run_on_a_busy_host_is_flagged_in_rows_table_and_warning(tmp_path):
    # one other busy process on the host: the case the trust issue names (b2 q1 k512 decode)
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        proc = run_cli("run", "--device", "cpu", "--impl", "naive", "flash", "--model", "llama-3-8b",
                       "--shape", "batch=2,q_len=1,kv_len=512", "--out", str(tmp_path))
    finally:
        hog.kill()
        hog.wait()
    assert proc.returncode == 0, proc.stderr
    df = pd.read_csv(tmp_path / "results.csv")
    assert df.noisy.all() and df.noise_reason.str.startswith("busy host").all(), df[["impl", "noise_reason"]]
    assert proc.stdout.count("NOISY") == 2
    # the hog may make rows drift too (their own warning): the noise's warning is one line
    warning = [line for line in proc.stdout.splitlines() if line.startswith("warning:") and "noisy" in line]
    assert len(warning) == 1 and "2 of 2 timed rows were noisy" in warning[0] and "re-run" in warning[0]


@pytest.mark.slow
def test_run_linear_by_hand_and_by_op(tmp_path):
    proc = run_cli("run", "--op", "linear", "--impl", "naive", "torch", "--model", "llama-3-8b",
                   "--shape", "m=3,n=97,k=4095", "--shape", "m=2,projection=o", "--shape", "q_len=4,kv_len=40",
                   "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    df = pd.read_csv(tmp_path / "results.csv")
    assert set(df.op) == {"linear"} and len(df) == 4 and (df.status == "ok").all()  # the attention shape is left out
    assert set(df.projection.dropna()) == {"o"} and set(df.n) == {97, 4096}
    assert "linear" in proc.stdout and "m3 n97 k4095" in proc.stdout
    bad = run_cli("run", "--op", "matmul")
    assert bad.returncode == 2 and "op: unknown operator 'matmul'" in bad.stderr


def test_seconds_options_are_checked_before_anything_runs():
    for args, message in ((("run", "--time-budget", "0"), "time-budget: must be a positive number of seconds"),
                          (("run", "--sample-time", "-1"), "sample-time: must be a positive number of seconds"),
                          (("phases", "--sample-time", "0"), "sample-time: must be a positive number of seconds"),
                          (("run", "--ray", "--time-budget", "5"), "not with --ray")):
        proc = run_cli(*args)
        assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, \
            (args, proc.stderr)


@pytest.mark.parametrize("args,message", [
    (["run", "--ci-target", "0"], "ci-target: must be above 0 and below 100%, got '0'"),
    (["run", "--rounds", "0"], "rounds: must be a positive whole number, got 0"),
    (["run", "--rounds", "3", "--no-isolate"], "rounds: each round after the first runs in a fresh worker process"),
    (["phases", "--ci-target", "half"], "ci-target: expected a fraction (0.02) or a percentage (2%), got 'half'"),
])
def test_a_bad_ci_target_gets_one_line_before_anything_runs(args, message, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([*args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and not out.exists()


@pytest.mark.parametrize("args,message", [
    (["--batch", "0"], "batch: must be a positive whole number, got 0"),
    (["--prompt", "16", "0"], "prompt: must be a positive whole number, got 0"),
    (["--chunk", "0"], "chunk: must be a positive whole number, got 0"),
    (["--context", "-3"], "context: must be a positive whole number, got -3"),
    (["--chunk-batch", "0"], "chunk-batch: must be a positive whole number"),
    (["--reference-layers", "0"], "reference-layers: must be a positive whole number"),
    (["--case-timeout", "-2"], "case-timeout: must be 0 (no limit) or a positive number of seconds"),
])
def test_phases_counts_are_checked_before_a_folder_is_made(args, message, tmp_path, capsys):
    out = tmp_path / "phases"
    assert main(["phases", "--model", "llama-3-8b", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and not out.exists()


def test_a_mixtures_reference_layers_must_pass_its_dense_layers(tmp_path, capsys):
    out = tmp_path / "phases"
    assert main(["phases", "--model", "deepseek-v3", "--reference-layers", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "reference-layers: deepseek-v3's first 3 layers are dense; L must be at least 3" in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


# last in this file: its tests before it run while another xdist worker may be making quick_run
def test_quick_run_writes_rows_parquet_and_run_json(quick_run):
    # what must hold on any machine: the best device here, its default dtype, every impl available on it
    device = resolve_device(None)
    dtype = default_dtype(device)
    cases = suite_cases("quick", device.type, dtype)
    # the compiled impls (flex, compiled) are left out of the quick suite unless named: their compiles cost seconds
    impls = {op: [i for i in available_impls(device, op=op) if not OPS[op][i].compiles]
             for op in ("attention", "linear", "qlinear")}
    csv = pd.read_csv(quick_run / "results.csv")
    parquet = pd.read_parquet(quick_run / "results.parquet")
    assert list(csv.columns) == COLUMNS and set(ISSUE_COLUMNS) <= set(csv.columns)
    assert len(csv) == len(parquet) == sum(len(impls[c.op]) for c in cases)
    assert (parquet.status == "ok").all(), parquet[["impl", "status", "reason"]]
    assert set(parquet.phase) == {"prefill", "chunked_prefill", "decode"} and set(parquet.dtype) == {dtype, "bfloat16"}
    assert (parquet[parquet.op == "qlinear"].dtype == "bfloat16").all()  # beside its GEMV unquantized, in bf16
    measured = json.loads((quick_run / "run.json").read_text())["ceilings"]["peak_tflops"]
    assert {p for c in parquet.compute_dtype for p in c.split("+")} <= set(measured)  # each row's own ceiling
    assert set(parquet.op) == {"attention", "linear", "qlinear"} and (parquet.device_kind == device.type).all()
    for op, names in impls.items():
        assert set(parquet[parquet.op == op].impl) == set(names)
    assert {"naive", "flash"} <= set(impls["attention"]) and {"naive", "torch"} <= set(impls["linear"])
    linear = parquet[parquet.op == "linear"]
    assert set(linear.phase) == {"decode", "prefill"} and (linear.flops == 2 * linear.m * linear.n * linear.k).all()
    parquet = parquet[parquet.op == "attention"]
    triton = parquet[parquet.impl == "triton"]
    assert (triton["mode"] == triton_mode.mode()).all() and triton.backend.str.startswith("triton-").all()
    assert (parquet.max_rel_err < (1e-4 if dtype == "float32" else 0.05)).all() and (parquet.pct_roofline > 0).all()
    assert (parquet.kv_tokens == parquet.batch * parquet.kv_len).all() and parquet.noisy.dtype == bool
    meta = json.loads((quick_run / "run.json").read_text())
    assert meta["schema"] == SCHEMA_VERSION and meta["run_id"] == parquet.run_id.iloc[0] and meta["finished"]
    assert {"python", "torch", "triton", "flash_attn"} <= set(meta["versions"])
    assert meta["ceilings"]["peak_gbps"] > 0 and dtype in meta["ceilings"]["peak_tflops"]
    assert meta["ceilings"]["source"] in ("measured", "cached") and meta["ceilings"]["age_s"] >= 0
    assert meta["device"]["kind"] == device.type and "run" in meta["command"]
    assert meta["state_before"] and meta["state_after"] and meta["measurement"]["device"] == str(device)


def test_rounds_default_to_three_or_the_environment_and_to_one_in_this_process(monkeypatch):
    from argparse import Namespace

    from phasebench.bench.cli.options import DEFAULT_ROUNDS, rounds_of

    monkeypatch.delenv("PHASEBENCH_ROUNDS", raising=False)
    assert rounds_of(Namespace(rounds=None, no_isolate=False)) == DEFAULT_ROUNDS == 3
    assert rounds_of(Namespace(rounds=5, no_isolate=False)) == 5
    assert rounds_of(Namespace(rounds=None, no_isolate=True)) == 1  # rounds would share this process
    assert rounds_of(Namespace(rounds=1, no_isolate=True)) == 1
    monkeypatch.setenv("PHASEBENCH_ROUNDS", "2")
    assert rounds_of(Namespace(rounds=None, no_isolate=False)) == 2


@pytest.mark.parametrize("value", ["abc", "0", "-2"])
def test_a_bad_rounds_setting_in_the_environment_is_one_line(monkeypatch, value):
    from argparse import Namespace

    from phasebench.bench.cli.options import rounds_of
    from phasebench.bench.sweep.selection import UsageError

    monkeypatch.setenv("PHASEBENCH_ROUNDS", value)
    with pytest.raises(UsageError, match="rounds: PHASEBENCH_ROUNDS must be a positive whole number"):
        rounds_of(Namespace(rounds=None, no_isolate=False))
