"""The correctness gate: wrong kernels registered as plugins are recorded incorrect, correct ones pass, in bf16."""

from __future__ import annotations

import math

import pytest
import torch
from phasebench.bench.instruments.gate import EPS, FACTOR, judge, limit_for
from phasebench.bench.ops.attention.cases import AttentionCase
from phasebench.bench.sweep import runner
from phasebench.kernels import attention, register
from phasebench.kernels.registry import OPS

FIGURES = ("latency_ms", "tflops", "gbps", "pct_roofline")


def drops_last_block(q, k, v, *, causal, scale, cache_seqlens):
    """Forgets the last 64-key block of the cache."""
    return attention(q, k[:, :, :-64], v[:, :, :-64], impl="naive", causal=causal, scale=scale)


def diagonal_one_off(q, k, v, *, causal, scale, cache_seqlens):
    """Bottom-right causal mask one key short: query i sees keys j <= Sk - Sq + i - 1."""
    return attention(q, k[:, :, :-1], v[:, :, :-1], impl="naive", causal=causal, scale=scale)


def returns_fp32(q, k, v, *, causal, scale, cache_seqlens):
    return attention(q.float(), k.float(), v.float(), impl="naive", causal=causal, scale=scale)


def broadcasts_heads(q, k, v, *, causal, scale, cache_seqlens):
    return attention(q, k, v, impl="naive", causal=causal, scale=scale)[:, :1]


@pytest.fixture
def wrong_kernels():
    names = {"drops_block": drops_last_block, "diag_off": diagonal_one_off, "fp32_out": returns_fp32,
             "broadcast": broadcasts_heads}
    for name, fn in names.items():
        register("attention", name, fn, devices=("cpu", "cuda"), dtypes=("bfloat16", "float16", "float32"))
    yield list(names)
    for name in names:
        OPS["attention"].pop(name, None)


def device():
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def run_cases(tmp_path, cases, impls):
    df = runner.run(runner.RunConfig(cases, impls, device(), tmp_path, suite="test", detect_contention=False))
    return {(r.impl, r.q_len): r for r in df.itertuples()}


def test_wrong_kernels_are_incorrect_in_bf16_and_get_no_figures(tmp_path, wrong_kernels):
    # the two wrong kernels that the old fixed 4e-2 bf16 budget let through
    decode = AttentionCase(1, 32, 8, 1, 131072, 128, True, "bfloat16")
    verify = AttentionCase(1, 32, 8, 16, 32768 + 16, 128, True, "bfloat16")
    rows = run_cases(tmp_path / "decode", [decode], ["naive", "flash", "drops_block"])
    rows.update(run_cases(tmp_path / "verify", [verify], ["naive", "flash", "diag_off", "fp32_out", "broadcast"]))
    for (impl, _), r in rows.items():
        if impl in ("naive", "flash"):
            assert r.status == "ok", (impl, r.reason)
            assert r.max_rel_err < 0.02
        else:
            assert r.status == "incorrect", (impl, r.status, r.reason)
            assert all(math.isnan(getattr(r, c)) for c in FIGURES)
    assert 0.01 < rows[("drops_block", 1)].max_rel_err < 0.04  # passed the old gate
    assert 0.01 < rows[("diag_off", 16)].max_rel_err
    assert "above the bfloat16 limit" in rows[("drops_block", 1)].reason
    assert "dtype torch.float32 differs" in rows[("fp32_out", 16)].reason
    assert "shape (1, 1, 16, 128) differs" in rows[("broadcast", 16)].reason
    assert rows[("drops_block", 1)].backend.startswith("plugin:")


def test_limits_follow_the_naive_error_in_low_precision():
    assert limit_for("float32", None) == 1e-4
    assert limit_for("bfloat16", 0.004) == pytest.approx(FACTOR * 0.004 + EPS)
    with pytest.raises(ValueError, match="baseline_error"):
        limit_for("float16", None)


def test_judge_checks_finiteness_shape_and_dtype():
    gen = torch.Generator().manual_seed(7)
    ref = torch.randn(2, 3, 5, 8, generator=gen, dtype=torch.float64)
    out = ref.to(torch.float16)
    assert judge(out, ref, "float16", 1e-3).ok
    bad = out.clone()
    bad[1, 2, 4, 7] = float("nan")
    assert not judge(bad, ref, "float16", 1e-3).ok
    assert "shape" in judge(out[:, :, :4], ref, "float16", 1e-3).reason
    assert "dtype" in judge(out.float(), ref, "float16", 1e-3).reason
    assert "not a tensor" in judge(None, ref, "float16", 1e-3).reason
