"""The attention baseline: the same math in the case's dtype with a tiled kernel's rounding points, fp32 scores on
large logits too, computed without any registered impl."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from phasebench.bench.instruments.gate import BASELINE_CAP, relative_error
from phasebench.bench.ops.attention import baseline, inputs, reference
from phasebench.bench.ops.attention.cases import AttentionCase
from phasebench.kernels.registry import OPS

CPU = torch.device("cpu")
UNIT = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}  # the dtype's unit roundoff


def refuse(*args, **kwargs):
    raise AssertionError("the baseline called a registered impl or the library it wraps")


@pytest.fixture
def no_impls(monkeypatch):
    """Every registered attention impl, and SDPA, fail the test if called."""
    for name, impl in list(OPS["attention"].items()):
        monkeypatch.setitem(OPS["attention"], name, dataclasses.replace(impl, plan=refuse))
    monkeypatch.setattr(F, "scaled_dot_product_attention", refuse)


def tiled_by_hand(case, x, round_probabilities=True):
    """Full-matrix attention with the baseline's rounding points: fp32 scores and softmax, the probabilities rounded
    to the dtype, fp32 P.V, the output rounded once (one chunk, no mask: a decode case)."""
    g = case.q_heads // case.kv_heads
    k, v = (t.float().repeat_interleave(g, 1) for t in (x.k, x.v))
    s = x.q.float() @ k.transpose(-1, -2) * case.head_dim ** -0.5
    p = torch.exp(s - s.amax(-1, keepdim=True))
    rounded = p.to(x.q.dtype).float() if round_probabilities else p
    return ((rounded @ v) / p.sum(-1, keepdim=True)).to(x.q.dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_baseline_rounds_where_a_tiled_kernel_does_and_calls_no_impl(dtype, no_impls):
    case = AttentionCase(2, 6, 2, 1, 333, 80, True, dtype)
    x = inputs.make_inputs(case, CPU, 4)
    out = baseline.attention_in_dtype(case, x, CPU)
    assert out.dtype == x.q.dtype and out.shape == x.q.shape
    by_hand = tiled_by_hand(case, x)
    # fp32 sums in another order (another BLAS, another CPU) move a score by an fp32 rounding and flip the rounding of
    # a probability now and then (0-5% of the outputs, by host): far fewer than leaving out the probabilities'
    # rounding point flips on the same host (about 40%)
    unrounded = tiled_by_hand(case, x, round_probabilities=False)
    assert (out != by_hand).float().mean() < (out != unrounded).float().mean() / 4
    moved = (out.float() - by_hand.float()).abs().amax(-1) / by_hand.float().abs().amax(-1)
    assert moved.max() <= 2 * UNIT[dtype]  # per output row, at the row's scale: an element near zero moves more
    err = baseline.baseline_error(case, x, reference.reference(case, x, CPU))
    assert 0.25 * UNIT[dtype] < err < 2 * UNIT[dtype] <= BASELINE_CAP[dtype]


def test_fp32_has_no_baseline():
    case = AttentionCase(1, 2, 1, 3, 17, 16, True, "float32")
    x = inputs.make_inputs(case, CPU, 1)
    assert baseline.baseline_error(case, x, reference.reference(case, x, CPU)) is None


def test_the_stress_baseline_keeps_fp32_scores():
    # logits of about +-75 at 49 keys: rounded to bf16 they move by up to 0.25, a probability by up to 28%
    case = AttentionCase(1, 8, 2, 1, 49, 128, True, "bfloat16")
    x = inputs.large_logits(case, inputs.make_inputs(case, CPU, 2))
    ref = reference.reference(case, x, CPU)
    err = baseline.baseline_error(case, x, ref)
    g = case.q_heads // case.kv_heads
    k, v = (t.repeat_interleave(g, 1) for t in (x.k, x.v))
    scores_in_bf16 = (x.q @ k.transpose(-1, -2)).float() * case.head_dim ** -0.5  # the old baseline's scores
    old = torch.softmax(scores_in_bf16, dim=-1).to(v.dtype) @ v
    assert err < 2 * UNIT["bfloat16"] and relative_error(old, ref) > 4 * err
