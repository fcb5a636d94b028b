"""The runner, the CLI and the pytest-benchmark suite end to end on CUDA, and the current-device switch for cuda:N."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from phasebench.bench.ops.attention.cases import AttentionCase
from phasebench.bench.sweep import runner
from phasebench.kernels import attention, register
from phasebench.kernels.registry import OPS

from ...conftest import run_cli, run_pytest_bench

pytestmark = pytest.mark.cuda
SHAPES = ("batch=2,q_heads=8,kv_heads=2,q_len=1,kv_len=4097,head_dim=128",  # decode, GQA, an odd cache
          "batch=1,q_heads=8,kv_heads=2,q_len=257,kv_len=257,head_dim=128,causal=1",  # prefill
          "batch=1,q_heads=8,kv_heads=2,q_len=7,kv_len=1031,head_dim=128,causal=1",  # verify after a prefix
          "m=3,n=4096,k=4095", "m=513,n=1000,k=512")  # a skinny GEMM and a tiled one
IMPLS = ("naive", "flash", "triton", "torch")


def _run(tmp_path, *extra):
    shapes = [arg for shape in SHAPES for arg in ("--shape", shape)]
    proc = run_cli("run", "--device", "cuda", "--impl", *IMPLS, *shapes, "--out", str(tmp_path), *extra,
                   timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return pd.read_csv(tmp_path / "results.csv"), json.loads((tmp_path / "run.json").read_text())


@pytest.mark.parametrize("graph", [False, True], ids=["events", "cuda_graph"])
def test_run_on_cuda_measures_every_impl_compiled_in_bf16(tmp_path, graph):
    rows, run = _run(tmp_path, *(["--cuda-graph"] if graph else []))
    assert len(rows) == 3 * 3 + 2 * 3  # attention: naive, flash, triton; linear: naive, torch, triton
    bad = rows[rows["status"] != "ok"]
    assert bad.empty, bad[["impl", "shape", "status", "reason"]].to_string()
    assert (rows["dtype"] == "bfloat16").all() and (rows["mode"] == "compiled").all()
    assert (rows["device_kind"] == "cuda").all() and (rows["samples"] >= 10).all()
    assert (rows["timer"] == ("cuda-graph+events" if graph else "cuda-events")).all()
    assert (rows["latency_ms"] > 0).all() and rows["pct_roofline"].notna().all()
    triton = rows[rows["impl"] == "triton"]
    assert triton["backend"].str.endswith(":compiled").all()
    assert run["device"]["kind"] == "cuda" and run["ceilings"]["kind"] == "cuda"
    assert run["device"]["name"] == torch.cuda.get_device_name(0)
    tuned = {record["kernel"] for record in run["autotune"]}
    assert {"prefill_kernel", "split_kv_kernel", "splitk_gemv_kernel", "gemm_kernel"} <= tuned
    for record in run["autotune"]:
        assert record["config"]["num_warps"] in (1, 2, 4, 8, 16) and "torch.bfloat16" in record["dtypes"]


def test_pytest_benchmark_suite_on_cuda(tmp_path):
    out = tmp_path / "bench.json"
    # naive linear multiplies elementwise: seconds per call on the quick suite's M=2048 GEMM, so it is left out here
    impls = ("naive", "flash", "triton", "torch")
    proc = run_pytest_bench(out, "--device", "cuda", "--suite", "quick", *[a for i in impls for a in ("--impl", i)],
                            "-k", "not (linear and naive)")
    assert proc.returncode == 0, proc.stdout[-3000:]
    benches = json.loads(out.read_text())["benchmarks"]
    assert {b["extra_info"]["impl"] for b in benches} == set(impls)
    assert {b["extra_info"]["impl"] for b in benches if b["extra_info"]["op"] == "linear"} == {"triton", "torch"}
    for b in benches:
        info = b["extra_info"]
        assert info["device_kind"] == "cuda" and info["mode"] == "compiled" and info["status"] == "ok"
        assert info["timer"] == "pytest-benchmark" and info["dtype"] == "bfloat16" and b["stats"]["rounds"] >= 5


@pytest.fixture
def where_it_ran():
    """A plugin that records the current CUDA device and its inputs' device, then runs naive attention."""
    seen = []

    def recorder(q, k, v, *, causal, scale, cache_seqlens):
        seen.append((torch.cuda.current_device(), q.device, k.device))
        return attention(q, k, v, impl="naive", causal=causal, scale=scale, cache_seqlens=cache_seqlens)

    register("attention", "where_it_ran", recorder, devices=("cuda",), dtypes=("bfloat16",))
    yield seen
    OPS["attention"].pop("where_it_ran", None)


@pytest.mark.parametrize("index", [0, 1])
def test_a_run_on_cuda_n_makes_device_n_current(tmp_path, where_it_ran, index):
    if index >= torch.cuda.device_count():
        pytest.skip(f"cuda:{index} needs {index + 1} GPUs, this machine has {torch.cuda.device_count()}")
    device = torch.device("cuda", index)
    torch.cuda.set_device(0)  # the switch must come from the runner, not from an earlier test
    case = AttentionCase(2, 8, 2, 1, 1000, 64, True, "bfloat16")
    df = runner.run(runner.RunConfig([case], ["where_it_ran", "triton"], device, tmp_path, suite="test"))
    assert (df["status"] == "ok").all(), df[["impl", "status", "reason"]].to_string()
    assert set(df["device"]) == {torch.cuda.get_device_name(index)}
    assert where_it_ran and all(cur == index and q.index == index and k.index == index
                                for cur, q, k in where_it_ran)
    assert torch.cuda.current_device() == 0  # and restores the previous device afterwards
