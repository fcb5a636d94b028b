"""The low-precision baseline of an MLA decode case: the reference's blocked math with a tiled kernel's rounding
points in the case's dtype, written independently of every registered impl."""

from __future__ import annotations

import torch

from ...instruments.gate import relative_error
from ...instruments.roofline import TORCH_DTYPES
from ..attention import baseline as attention_baseline
from ..attention.reference import blocked_attention
from .cases import MLACase
from .inputs import MLAInputs

# attention's cap (2 u): the same blocked math and rounding points (0.6-1.0 u at 4k-64k keys). The default 4 u let a
# bf16 limit reach 3.1%, past the 1.0-2.7% that a kernel dropping one 64-key block of 64k keys errs.
CAP_UNITS = attention_baseline.CAP_UNITS


def mla_in_dtype(case: MLACase, inputs: MLAInputs, device: torch.device) -> torch.Tensor:
    """The same math with a tiled kernel's rounding points in the case's dtype (fp32 scores and sums, the
    probabilities and the output rounded), as the attention baseline does."""
    return blocked_attention(case.attention, inputs.as_attention(case), device, torch.float32,
                             rounding=TORCH_DTYPES[case.dtype], scale=case.scale)


def baseline_error(case: MLACase, inputs: MLAInputs, ref: torch.Tensor) -> float | None:
    """The relative error of mla_in_dtype (None in fp32, which has a fixed limit)."""
    if case.dtype == "float32":
        return None
    return relative_error(mla_in_dtype(case, inputs, ref.device), ref)
