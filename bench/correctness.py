"""Inputs for a case and the higher-precision reference every output is checked against before timing."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels import attention
from .cases import AttentionCase
from .roofline import TORCH_DTYPES

# Relative error (max |out - ref| / max |ref|) allowed per dtype: a few units of the dtype's
# rounding through the two matmuls and the softmax, far below what a wrong kernel produces.
TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 4e-2}
# The reference processes query rows in chunks so its score matrix stays below this size.
REFERENCE_SCORE_BYTES = 1 << 30


@dataclass(frozen=True)
class CaseInputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor


def make_inputs(case: AttentionCase, device: torch.device, seed: int = 0) -> CaseInputs:
    """Standard-normal q, k, v in the case's dtype, from a fixed seed (never zeros)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = TORCH_DTYPES[case.dtype]

    def draw(heads, length):
        return torch.randn((case.batch, heads, length, case.head_dim), generator=gen, device=device, dtype=dtype)

    q = draw(case.q_heads, case.q_len)
    return CaseInputs(q, draw(case.kv_heads, case.kv_len), draw(case.kv_heads, case.kv_len))


def reference_dtype(case: AttentionCase, device: torch.device) -> torch.dtype:
    """fp64 on the host for cases of modest size; fp32 on GPUs, where fp64 is slow."""
    return torch.float64 if device.type == "cpu" else torch.float32


def reference(case: AttentionCase, inputs: CaseInputs, device: torch.device) -> torch.Tensor:
    """Naive attention in higher precision, a chunk of query rows at a time (bottom-right causal kept).

    It reuses the `naive` implementation's masking and GQA folding, so the runner checks `naive`
    rows against its own math in higher precision; the unit tests check `naive` against an
    independent textbook formula (tests/kernels/reference.py).
    """
    dtype = reference_dtype(case, device)
    q, k, v = (t.to(dtype) for t in (inputs.q, inputs.k, inputs.v))
    elem = torch.finfo(dtype).bits // 8
    rows = max(1, REFERENCE_SCORE_BYTES // (case.batch * case.q_heads * case.kv_len * elem * 3))
    out = torch.empty_like(q)
    previous_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for start in range(0, case.q_len, rows):
            stop = min(start + rows, case.q_len)
            # query i of the chunk keeps its keys j <= Sk - Sq + i by cutting the keys at Sk - Sq + stop
            keys = case.kv_len - case.q_len + stop if case.causal else case.kv_len
            out[:, :, start:stop] = attention(q[:, :, start:stop], k[:, :, :keys], v[:, :, :keys],
                                              impl="naive", causal=case.causal)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous_tf32
    return out


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref|, NaN anywhere counting as an infinite error."""
    diff = (out.to(ref.dtype) - ref).abs()
    if not torch.isfinite(diff).all():
        return float("inf")
    return (diff.max() / ref.abs().max()).item()
