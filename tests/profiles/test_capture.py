"""`phasebench profile` end to end with torch.profiler on the CPU, and the nsys command it would run."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
from phasebench.bench.cli.main import main
from phasebench.profiles import capture, torch_trace
from phasebench.profiles.names import parse_case_key

from ..conftest import run_cli

SHAPES = ["q_len=32,kv_len=96,q_heads=4,kv_heads=2,head_dim=64",
          "q_len=1,kv_len=300,q_heads=4,kv_heads=1,head_dim=64,batch=2"]


def test_torch_profile_attributes_ops_to_each_case(tmp_path):
    args = ["profile", "--tool", "torch", "--impl", "naive", "flash", "--out", str(tmp_path)]
    for shape in SHAPES:
        args += ["--shape", shape]
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in ("kernels", "ranges", "summary"):
        assert (tmp_path / f"{name}.parquet").exists() and (tmp_path / f"{name}.csv").exists()
    summary = pd.read_parquet(tmp_path / "summary.parquet")
    assert len(summary) == 4  # 2 cases x 2 impls, one timed range each
    assert set(summary.impl) == {"naive", "flash"} and set(summary.phase) == {"chunked_prefill", "decode"}
    assert (summary.ranges == 1).all() and (summary.kernel_count > 0).all()
    assert (summary.kernel_time_ns > 0).all() and (summary.wall_ns >= summary.kernel_time_ns).all()
    assert (summary.flush_ns == 0).all() and (summary.flush_kernel_ns == 0).all()  # no L2 flush on the host
    assert (summary.launch_overhead_ns == summary.wall_ns - summary.kernel_time_ns).all()
    # the trace itself: setup and check ranges exist beside the timed ones, and ops sit in them
    ranges = torch_trace.read_ranges(tmp_path / "trace.json")
    names = set(ranges.name)
    assert any(n.startswith("setup: ") for n in names) and any(n.startswith("check: ") for n in names)
    kernels = pd.read_parquet(tmp_path / "kernels.parquet")
    timed = kernels[kernels.case_key.notna()]
    assert len(timed) == summary.kernel_count.sum()
    assert all(parse_case_key(k) is not None for k in timed.case_key)
    rows = pd.read_csv(tmp_path / "run" / "results.csv")
    assert len(rows) == 4 and (rows.status == "ok").all()
    # the timed range holds the samples only, not the warm-up: the same ops per sample, and on the CPU
    # flash is one top-level op per call
    per_case = summary.merge(rows[["impl", "phase", "samples"]], on=["impl", "phase"], validate="one_to_one")
    assert (per_case.kernel_count % per_case.samples == 0).all()
    flash = per_case[per_case.impl == "flash"]
    assert (flash.kernel_count == flash.samples).all()
    assert "overhead us" in proc.stdout


def test_nsys_command_captures_only_the_profiler_range():
    cmd = capture.nsys_command(Path("/tmp/p/profile"), ["python", "-m", "x"])
    assert cmd[:2] == ["nsys", "profile"] and "--capture-range=cudaProfilerApi" in cmd
    assert "--trace=cuda,nvtx" in cmd and "--export=sqlite" in cmd and cmd[-3:] == ["python", "-m", "x"]


@pytest.mark.skipif(torch.cuda.is_available() and capture.nsys_path() is not None, reason="nsys and CUDA are here")
def test_nsys_without_cuda_or_nsys_is_a_one_line_error(capsys):
    assert main(["profile", "--tool", "nsys", "--impl", "naive"]) == 2
    assert "tool: nsys needs a CUDA device" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_cuda_profiler_range_needs_cuda(capsys, tmp_path):
    assert main(["run", "--cuda-profiler-range", "--impl", "naive", "--out", str(tmp_path)]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err
