"""The low-precision baseline of an attention case: the same math in the case's dtype, written independently of
every registered impl, whose error against the reference sets the gate's fp16/bf16 limit."""

from __future__ import annotations

import torch

from ...instruments.gate import relative_error
from ...instruments.roofline import TORCH_DTYPES
from .cases import AttentionCase
from .inputs import CaseInputs
from .reference import blocked_attention

# The most this baseline errs, in units of roundoff: its probabilities and its output each rounded once (1.0-1.4 u on
# the CPU suites and the tests). 2 u keeps every bf16 limit under 1.6%, below the 1.7-4.8% that a kernel dropping
# one 64-key block at kv 65536-131072 errs (bench.instruments.gate).
CAP_UNITS = 2.0


def attention_in_dtype(case: AttentionCase, inputs: CaseInputs, device: torch.device) -> torch.Tensor:
    """Attention with a tiled kernel's rounding points in the case's dtype: q, k, v as given (in that dtype), scores
    and softmax in fp32 (exact products of the low-precision operands, fp32 sums: a tensor core's), the
    probabilities rounded to the dtype before P.V, fp32 accumulation, the output rounded once. Scores stay fp32 on
    the large-logit inputs too: rounded to bf16 there, a logit of 100 moves by 0.25 and a probability by 28%."""
    return blocked_attention(case, inputs, device, torch.float32, rounding=TORCH_DTYPES[case.dtype])


def baseline_error(case: AttentionCase, inputs: CaseInputs, reference: torch.Tensor) -> float | None:
    """The relative error of attention_in_dtype (None in fp32, which has a fixed limit)."""
    if case.dtype == "float32":
        return None
    return relative_error(attention_in_dtype(case, inputs, reference.device), reference)
