"""The correctness gate: an output must have the right shape and dtype and err at most as the dtype allows."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels import attention
from .cases import AttentionCase
from .correctness import CaseInputs, relative_error
from .roofline import TORCH_DTYPES

# fp32 has a fixed relative budget; in fp16/bf16 an output may err at most FACTOR times the error of
# the same naive math in that dtype, plus EPS (FlashAttention's rule): a fixed budget wide enough
# for the worst correct case lets a kernel that drops a 64-key block at long context through.
FIXED_TOLERANCE = {"float32": 1e-4}
FACTOR = 2.0
EPS = 1e-5
# The low-precision baseline is computed in slices of (sequence, query rows) of at most this many scores.
BASELINE_SCORES = 1 << 27


@dataclass(frozen=True)
class Verdict:
    """Whether an output passed, its relative error, the limit it was held to, and why not."""

    ok: bool
    error: float
    limit: float
    reason: str = ""


def limit_for(dtype: str, baseline_error: float | None) -> float:
    """The largest relative error a correct output may have in `dtype`."""
    if dtype in FIXED_TOLERANCE:
        return FIXED_TOLERANCE[dtype]
    if baseline_error is None:
        raise ValueError(f"baseline_error: needed for {dtype} (the naive error in that dtype)")
    return FACTOR * baseline_error + EPS


def judge(out, reference: torch.Tensor, dtype: str, baseline_error: float | None = None) -> Verdict:
    """Check shape, dtype, finiteness and error of `out` against the higher-precision `reference`."""
    if not isinstance(out, torch.Tensor):
        return Verdict(False, float("inf"), 0.0, f"output is a {type(out).__name__}, not a tensor")
    if tuple(out.shape) != tuple(reference.shape):
        return Verdict(False, float("inf"), 0.0,
                       f"output shape {tuple(out.shape)} differs from the expected {tuple(reference.shape)}")
    if out.dtype != TORCH_DTYPES[dtype]:
        return Verdict(False, float("inf"), 0.0, f"output dtype {out.dtype} differs from the input dtype {dtype}")
    limit = limit_for(dtype, baseline_error)
    err = relative_error(out, reference)
    if not err <= limit:
        rule = (f"the {dtype} limit {limit:.3g}" if dtype in FIXED_TOLERANCE else
                f"the {dtype} limit {limit:.3g} ({FACTOR:g} x naive {dtype} error {baseline_error:.3g} + {EPS:g})")
        return Verdict(False, err, limit, f"max relative error {err:.3g} above {rule}")
    return Verdict(True, err, limit)


def naive_in_dtype(case: AttentionCase, inputs: CaseInputs) -> torch.Tensor:
    """The naive math in the case's own dtype, a slice of sequences and query rows at a time (bounded scratch)."""
    out = torch.empty_like(inputs.q)
    lens = case.lengths
    rows = max(1, BASELINE_SCORES // (case.q_heads * case.kv_len))
    for b in range(case.batch):
        keys_b = lens[b]
        for start in range(0, case.q_len, rows):
            stop = min(start + rows, case.q_len)
            # query i keeps keys j <= L - Sq + i: cutting the keys at L - Sq + stop keeps the causal mask exact
            keys = keys_b - case.q_len + stop if case.causal else keys_b
            out[b:b + 1, :, start:stop] = attention(
                inputs.q[b:b + 1, :, start:stop], inputs.k[b:b + 1, :, :keys], inputs.v[b:b + 1, :, :keys],
                impl="naive", causal=case.causal)
    return out


def baseline_error(case: AttentionCase, inputs: CaseInputs, reference: torch.Tensor) -> float | None:
    """The relative error of the naive math in the case's dtype (None where the dtype has a fixed limit)."""
    if case.dtype in FIXED_TOLERANCE:
        return None
    return relative_error(naive_in_dtype(case, inputs), reference)
