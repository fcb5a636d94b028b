"""Elementwise cases: validation, cost by hand, keys and rows, and runs through the measuring path."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from phasebench.bench.ops import operator_of
from phasebench.bench.ops.elementwise.cases import KINDS, ElementwiseCase, flops, min_bytes, moved_bytes
from phasebench.bench.spec.roof import memory_floor_s, roof_level
from phasebench.bench.sweep.runner import RunConfig, run
from phasebench.kernels import elementwise, register
from phasebench.kernels.elementwise.request import KINDS as KERNEL_KINDS
from phasebench.kernels.registry import OPS
from phasebench.profiles.names import elementwise_key_for, parse_case_key

CPU = torch.device("cpu")
CASES = {
    "rmsnorm": ElementwiseCase("rmsnorm", 3, 4097, "bfloat16", "decode", "llama-3-8b"),
    "residual_add": ElementwiseCase("residual_add", 97, 4097, "float32", "prefill"),
    "silu_mul": ElementwiseCase("silu_mul", 1, 200, "bfloat16", "decode"),
    "rotary": ElementwiseCase("rotary", 97, 6, "bfloat16", "chunked_prefill", head_dim=80, kv_heads=2,
                              cache_len=1025),
    "kv_append": ElementwiseCase("kv_append", 3, 2, "bfloat16", "decode", head_dim=80, cache_len=1025),
    "greedy_pick": ElementwiseCase("greedy_pick", 3, 4097, "bfloat16", "decode"),
    "add_rmsnorm": ElementwiseCase("add_rmsnorm", 5, 999, "bfloat16", "decode", "llama-3-8b"),
}


def test_cost_by_hand():
    norm = ElementwiseCase("rmsnorm", 3, 4097, "bfloat16", "decode")
    assert flops(norm) == 4 * 3 * 4097 and min_bytes(norm) == 2 * (3 * 4097 + 4097 + 3 * 4097)
    rope = CASES["rotary"]  # q [97, 6, 80] and k [97, 2, 80] read and written once, int64 positions read
    assert flops(rope) == 3 * 97 * 8 * 80 and min_bytes(rope) == 2 * 2 * 97 * 8 * 80 + 8 * 97
    silu = ElementwiseCase("silu_mul", 5, 200, "float32", "prefill")
    assert flops(silu) == 5 * 5 * 200 and min_bytes(silu) == 4 * (2 * 5 * 200 + 5 * 200)
    kv = CASES["kv_append"]  # k, v read; the same elements written into the caches; the cache size costs nothing
    assert flops(kv) == 0 and min_bytes(kv) == 2 * (2 * 2 * 3 * 2 * 80) + 8 * 3
    pick = CASES["greedy_pick"]
    assert flops(pick) == 3 * 4097 and min_bytes(pick) == 2 * 3 * 4097 + 8 * 3
    assert min_bytes(CASES["residual_add"]) == 4 * 3 * 97 * 4097


def test_reads_and_writes_by_hand():
    """What each kind reads and what it writes: int64 positions are read, int64 token ids written."""
    norm = ElementwiseCase("rmsnorm", 3, 4097, "bfloat16", "decode")
    assert moved_bytes(norm) == (2 * (3 * 4097 + 4097), 2 * 3 * 4097)
    add = ElementwiseCase("residual_add", 5, 999, "float32", "decode")
    assert moved_bytes(add) == (4 * 2 * 5 * 999, 4 * 5 * 999)
    silu = ElementwiseCase("silu_mul", 5, 200, "float32", "decode")
    assert moved_bytes(silu) == (4 * 2 * 5 * 200, 4 * 5 * 200)
    rope = ElementwiseCase("rotary", 97, 8, "bfloat16", "prefill", head_dim=80, kv_heads=2)
    assert moved_bytes(rope) == (2 * 97 * 10 * 80 + 8 * 97, 2 * 97 * 10 * 80)
    kv = ElementwiseCase("kv_append", 3, 2, "bfloat16", "decode", head_dim=80, cache_len=4099)
    assert moved_bytes(kv) == (2 * 2 * 3 * 2 * 80 + 8 * 3, 2 * 2 * 3 * 2 * 80)  # the new k, v in; the caches' rows out
    pick = ElementwiseCase("greedy_pick", 3, 4097, "bfloat16", "decode")
    assert moved_bytes(pick) == (2 * 3 * 4097, 8 * 3)
    fused = ElementwiseCase("add_rmsnorm", 5, 999, "bfloat16", "decode")  # x, residual, weight in; normed, sum out
    assert moved_bytes(fused) == (2 * (2 * 5 * 999 + 999), 2 * 2 * 5 * 999) and flops(fused) == 5 * 5 * 999
    for c in (norm, add, silu, rope, kv, pick, fused):
        assert sum(moved_bytes(c)) == min_bytes(c)


@pytest.mark.parametrize("args,message", [
    (("layernorm", 3, 8, "float32", "decode"), "kind: must be one of rmsnorm"),
    (("rmsnorm", 0, 8, "float32", "decode"), "m: must be a positive int"),
    (("rmsnorm", 3, 8, "int8", "decode"), "dtype: must be one of"),
    (("rmsnorm", 3, 8, "float32", "verify"), "phase: must be one of prefill, chunked_prefill, decode"),
    (("rmsnorm", 3, 8, "float32", "decode", "", 80), "head_dim: rmsnorm does not take it"),
    (("rotary", 3, 8, "float32", "decode", "", 80), "kv_heads: rotary needs a positive kv_heads"),
    (("rotary", 3, 8, "float32", "decode", "", 79, 2), "head_dim: rotary needs an even head dim"),
    (("kv_append", 3, 8, "float32", "decode", "", 80, 0, 2), "cache_len: must be at least m = 3"),
    (("kv_append", 3, 8, "float32", "decode", "", 80, 8, 9), "kv_heads: kv_append does not take it"),
    (("greedy_pick", 3, 8, "float32", "decode", "", 0, 0, -1), "cache_len: must be a non-negative int"),
])
def test_bad_cases_are_one_line_errors(args, message):
    with pytest.raises(ValueError, match=message) as info:
        ElementwiseCase(*args)
    assert "\n" not in str(info.value)


def test_labels_rows_and_keys():
    assert KINDS == KERNEL_KINDS
    assert CASES["rmsnorm"].shape_label == "rmsnorm m3 n4097"
    assert CASES["rotary"].shape_label == "rotary m97 n6 hkv2 d80 c1025"
    row = CASES["kv_append"].row_fields()
    assert row["op"] == "elementwise" and row["kind"] == "kv_append" and "kv_heads" not in row
    assert (row["head_dim"], row["cache_len"]) == (80, 1025)
    assert operator_of(CASES["rmsnorm"]).name == "elementwise"
    key = elementwise_key_for(ElementwiseCase("rmsnorm", 8, 4096, "bfloat16", "decode"), "torch")
    assert key == "elementwise/torch/decode/rmsnorm-m8-n4096-bfloat16"
    parsed = parse_case_key(elementwise_key_for(CASES["rotary"], "my-rope.v2"))
    assert parsed["op"] == "elementwise" and parsed["impl"] == "my-rope.v2" and parsed["kind"] == "rotary"
    dims = (parsed["m"], parsed["n"], parsed["kv_heads"], parsed["head_dim"], parsed["cache_len"])
    assert dims == (97, 6, 2, 80, 1025)
    assert parsed["phase"] == "chunked_prefill" and parsed["dtype"] == "bfloat16" and parsed["k"] is None
    assert parse_case_key("elementwise/torch/decode/rmsnorm-m8-bfloat16") is None  # n is not optional


def _run(tmp_path, cases, impls):
    return run(RunConfig(cases, impls, CPU, tmp_path, detect_contention=False))


def test_every_kind_but_kv_append_runs_ok_through_the_runner(tmp_path):
    cases = [c for kind, c in CASES.items() if kind != "kv_append"]
    df = _run(tmp_path, cases, ["torch", "naive"])  # naive has no elementwise implementation: not run
    assert list(df.kind) == [c.kind for c in cases] and set(df.impl) == {"torch"}
    assert (df.status == "ok").all(), df[["kind", "reason"]]
    assert (df.op == "elementwise").all() and (df.backend == "torch-eager").all()
    assert list(df.m) == [c.m for c in cases] and list(df.n) == [c.n for c in cases]
    # an elementwise op streams nothing: timed warm, and judged at the ceilings of the cache level its footprint fits
    # (rows.bytes against l2_bytes and llc_bytes), or memory's where it fits none or the level has no ceilings
    assert (df.cache_state == "warm").all() and (df.max_rel_err <= 2e-2).all()
    fits = roof_level(df.cache_state, df.bytes, df.l2_bytes, df.llc_bytes)
    assert ((df.roof_level == fits) | ((df.roof_level == "memory") & df.level_read_gbps.isna())).all()
    # memory-bound wherever the floor of its reads and writes at those ceilings outlasts its FLOPs at the matmul peak
    # (a host without fast bf16 matmuls has a bf16 ridge near 1 FLOP/B, which puts a bf16 rmsnorm on the compute side)
    cached = df.roof_level != "memory"
    ceilings = [df[f"level_{s}_gbps"].where(cached, df[m]) for s, m in
                (("read", "read_gbps"), ("write", "write_gbps"), ("copy", "peak_gbps"))]
    floor = memory_floor_s(df.read_bytes, df.write_bytes, *ceilings)
    memory_side = pd.Series(floor > df.flops / (df.peak_tflops * 1e12), index=df.index)
    assert (df.bound == memory_side.map({True: "memory", False: "compute"})).all()
    rope = df[df.kind == "rotary"].iloc[0]
    assert (rope.head_dim, rope.kv_heads, rope.cache_len, rope.phase) == (80, 2, 1025, "chunked_prefill")
    assert rope.bytes == min_bytes(CASES["rotary"])
    assert df[df.kind == "rmsnorm"].iloc[0].model == "llama-3-8b"


def test_kv_append_runs_ok_through_the_runner(tmp_path):
    df = _run(tmp_path, [CASES["kv_append"]], ["torch"])
    assert (df.status == "ok").all() and df.kind.iloc[0] == "kv_append" and df.cache_len.iloc[0] == 1025
    assert df.gbps.iloc[0] > 0 and df.pct_roofline.iloc[0] > 0


def test_wrong_plugins_are_recorded_incorrect(tmp_path):
    def wrong(kind, *t, **options):
        """Plausible mistakes: no weight, a subtraction, halves swapped, another RoPE base, argmin, no write, the
        residual left out of the norm."""
        if kind == "rmsnorm":
            return elementwise(kind, t[0], torch.ones_like(t[1]), **options)
        if kind == "residual_add":
            return t[0] - t[1]
        if kind == "silu_mul":
            return elementwise(kind, torch.cat(t[0].chunk(2, dim=1)[::-1], dim=1))
        if kind == "rotary":
            return elementwise(kind, *t, base=10000.0)
        if kind == "kv_append":
            return t[0], t[1]  # writes nothing: the rows it must write are poisoned first
        if kind == "add_rmsnorm":  # the norm of x alone, the residual never added
            return elementwise("rmsnorm", t[0], t[2], **options), t[0] + t[1]
        return t[0].argmin(dim=1)

    register("elementwise", "wrong", wrong)
    try:
        df = _run(tmp_path, list(CASES.values()), ["wrong"])
    finally:
        OPS["elementwise"].pop("wrong", None)
    assert (df.status == "incorrect").all(), df[["kind", "status", "reason"]]
    assert set(df.kind) == set(KINDS)
