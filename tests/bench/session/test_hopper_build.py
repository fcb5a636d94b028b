"""Every Triton kernel compiles for sm_90 ahead of time, fits the H200, spills only where allowed, uses wgmma."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from phasebench.bench.session import hopper_build

pytestmark = pytest.mark.skipif(hopper_build.find_ptxas() is None,
                                reason="no ptxas: the Triton wheel carries one under backends/nvidia/bin")


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("hopper") / "builds.json"
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    command = [sys.executable, "-m", "phasebench.bench.session.hopper_build", "--json", str(out), "--jobs", "2"]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900, stdin=subprocess.DEVNULL)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_every_kernel_and_config_builds_within_the_h200(report):
    builds = [hopper_build.Build(**b) for b in report["builds"]]
    assert hopper_build.problems(builds) == [], report["problems"]
    assert {b.kernel for b in builds} == set(hopper_build._MODULES)
    assert all(b.registers and b.shared is not None and b.spill_stores is not None for b in builds)


@pytest.mark.slow
def test_autotune_lists_are_all_compiled(report):
    from phasebench.kernels.attention import triton_decode, triton_prefill
    from phasebench.kernels.linear import triton_linear

    def labels(kernel):
        return {b["config"] for b in report["builds"] if b["kernel"] == kernel and b["source"] == "autotune"}

    for kernel, configs in [("prefill_kernel", triton_prefill.TUNING_CONFIGS),
                            ("split_kv_kernel", triton_decode.TUNING_CONFIGS),
                            ("gemm_kernel", triton_linear.GEMM_CONFIGS)]:
        assert {hopper_build._label(dict(c.kwargs), c.num_warps, c.num_stages) for c in configs} <= labels(kernel)
    gemv = {hopper_build._label({"BLOCK_M": 16, **c.kwargs}, c.num_warps, c.num_stages)
            for c in triton_linear.GEMV_CONFIGS}
    assert gemv <= labels("splitk_gemv_kernel")


@pytest.mark.slow
def test_window_sink_and_mla_kernels_are_built_at_every_config(report):
    from phasebench.kernels.attention import triton_decode, triton_prefill
    from phasebench.kernels.mla import triton_mla

    def configs(kernel, flags):
        return {b["config"] for b in report["builds"] if b["kernel"] == kernel and b["flags"] == flags}

    def labels(tuned, **extra):
        return {hopper_build._label({**extra, **c.kwargs}, c.num_warps, c.num_stages) for c in tuned}

    assert configs("prefill_kernel", "D64 causal window sinks") == labels(triton_prefill.TUNING_CONFIGS)
    assert configs("split_kv_kernel", "D64 rows16 seqlens window") == labels(triton_decode.TUNING_CONFIGS)
    assert configs("split_kv_kernel", "D64 rows16 causal seqlens page16 window") == labels(triton_decode.TUNING_CONFIGS)
    for flags in ("DV512 DR64 seqlens", "DV512 DR64 seqlens page64"):
        assert configs("mla_split_kernel", flags) == labels(triton_mla.TUNING_CONFIGS)
    assert {b["flags"] for b in report["builds"] if b["kernel"] == "reduce_kernel"} >= {"sinks", "mla"}


@pytest.mark.slow
def test_paged_kernels_are_built_for_both_ways_of_reading_the_table(report):
    # pages of 16 take one table entry per key, pages of 256 one per key block; 64 at verify rows mixes them by BLOCK_N
    from phasebench.kernels.attention import triton_decode

    paged = {(b["kernel"], b["flags"].rsplit(" ", 1)[-1]) for b in report["builds"] if " page" in b["flags"]}
    assert paged >= {("split_kv_kernel", "page16"), ("split_kv_kernel", "page256"), ("split_kv_kernel", "page64"),
                     ("prefill_kernel", "page16"), ("prefill_kernel", "page256")}
    every = {hopper_build._label(dict(c.kwargs), c.num_warps, c.num_stages) for c in triton_decode.TUNING_CONFIGS}
    for page in ("page16", "page256"):
        built = {b["config"] for b in report["builds"]
                 if b["kernel"] == "split_kv_kernel" and b["flags"] == f"D128 rows16 seqlens {page}"}
        assert built == every


@pytest.mark.slow
def test_16_bit_gemm_and_attention_dots_use_wgmma(report):
    # 64 rows or more per warpgroup: prefill, the tiled GEMM and verify-sized split-KV; decode's 16 rows use mma.sync
    wide = [b for b in report["builds"] if b["dtype"] in ("bf16", "fp16") and b["source"] == "autotune" and
            (b["kernel"] in ("prefill_kernel", "gemm_kernel") or
             (b["kernel"] == "split_kv_kernel" and "rows16 " not in b["flags"]))]
    assert {b["kernel"] for b in wide} == {"prefill_kernel", "gemm_kernel", "split_kv_kernel"}
    assert {b["dtype"] for b in wide} == {"bf16", "fp16"}
    assert [b["name"] for b in wide if b["mma"] != "wgmma"] == []
    # every 16-bit dot is on tensor cores, fp32 (ieee) dots are not
    dots = [b for b in report["builds"] if b["kernel"] not in ("reduce_kernel", "splitk_reduce_kernel")
            and not (b["kernel"] == "qlinear_kernel" and "M1" in b["flags"].split())]  # one token: no dot
    assert all(b["mma"] in ("wgmma", "mma") for b in dots if b["dtype"] != "fp32")
    assert all(b["mma"] == "fma" for b in dots if b["dtype"] == "fp32")


@pytest.mark.slow
def test_quantized_kernels_build_for_every_scheme(report):
    from phasebench.kernels.qlinear import triton_qlinear

    built = [b for b in report["builds"] if b["kernel"] == "qlinear_kernel"]
    assert {b["flags"].split()[0] for b in built} == set(triton_qlinear.QMODES)
    int4 = {(b["flags"], b["config"]) for b in built if b["flags"].startswith("int4-g128")}
    for block_m, flags in ((1, "int4-g128 M1"), (16, "int4-g128 M16 split")):
        assert {(flags, hopper_build._label({"BLOCK_M": block_m, **c.kwargs}, c.num_warps, c.num_stages))
                for c in triton_qlinear.GEMV_CONFIGS} <= int4
    gemm = [b for b in built if b["config"].startswith("M128") or b["config"].startswith("M64")]
    assert {b["config"] for b in gemm} == {hopper_build._label(dict(c.kwargs), c.num_warps, c.num_stages)
                                           for c in triton_qlinear.GEMM_CONFIGS}
    assert all(b["mma"] == "wgmma" for b in gemm)  # the tiled GEMM's dots on Hopper's tensor cores
    assert all(b["mma"] == "fma" for b in built if "M1" in b["flags"].split())  # one token: FMAs, no MMA tile
    assert all(b["mma"] == "mma" for b in built if "M16" in b["flags"])  # 16 rows: mma.sync


def test_problems_flags_spills_and_overruns_outside_the_allow_lists():
    base = dict(kernel="gemm_kernel", config="M7 w4 s3", dtype="bf16", flags="", source="autotune",
                registers=200, spill_stores=0, spill_loads=0, shared=1000)
    spill = hopper_build.Build(name="gemm_kernel bf16 M7 w4 s3", **{**base, "spill_stores": 12, "spill_loads": 20})
    big = hopper_build.Build(name="gemm_kernel bf16 M9 w4 s3", **{**base, "config": "M9 w4 s3",
                                                                 "shared": hopper_build.H200_SHARED_BYTES + 1})
    broken = hopper_build.Build(name="prefill_kernel bf16 x", **{**base, "kernel": "prefill_kernel", "shared": None,
                                                                 "error": "CompilationError: boom"})
    found = hopper_build.problems([spill, big, broken])
    assert any("spills 12 B stores" in line for line in found)
    assert any("above the H200" in line for line in found)
    assert any("compile error" in line for line in found)
    assert any("prefill_kernel bf16 : no config fits" in line for line in found)
    # a group with one config that fits is launchable: only the spill is left
    assert hopper_build.problems([spill]) == [found[0]]


@pytest.mark.slow
def test_the_moe_kernels_build_every_config_at_decode_and_prefill_blocks(report):
    from phasebench.kernels.moe import triton_moe

    for kernel, configs in (("gate_up_kernel", triton_moe.GATE_UP_CONFIGS), ("down_kernel", triton_moe.DOWN_CONFIGS)):
        for block_m, mma in ((16, "mma"), (64, "wgmma")):  # a decode batch's 16-row blocks, prefill's 64
            built = {b["config"]: b["mma"] for b in report["builds"]
                     if b["kernel"] == kernel and b["dtype"] == "bf16" and b["flags"] == f"M{block_m}"}
            assert set(built) == {hopper_build._label(dict(c.kwargs), c.num_warps, c.num_stages) for c in configs}
            assert set(built.values()) == {mma}
