"""The low-precision baseline of a quantized linear case: the dequantized weights rounded to the activation dtype, then
the linear baseline's product (exact fp32 products, fp32 accumulation, the output rounded once), written independently
of every registered impl (no F.linear, no torch int4/int8 op, no Triton)."""

from __future__ import annotations

import torch

from ...instruments.gate import relative_error
from ...instruments.roofline import TORCH_DTYPES
from ..linear.inputs import LinearInputs
from ..linear.reference import blocked_product
from .cases import QLinearCase
from .inputs import QLinearInputs


def qlinear_in_dtype(case: QLinearCase, inputs: QLinearInputs, device: torch.device) -> torch.Tensor:
    """x @ w.T with w the packed weights dequantized and rounded to the case's dtype, as a kernel that dequantizes to
    the activation dtype computes it."""
    dtype = TORCH_DTYPES[case.dtype]
    dense = LinearInputs(inputs.x, inputs.qweight.dequantize(dtype))
    return blocked_product(case, dense, device, torch.float32, rounding=dtype)


def baseline_error(case: QLinearCase, inputs: QLinearInputs, ref: torch.Tensor) -> float | None:
    """The relative error of qlinear_in_dtype (None in fp32, which has a fixed limit)."""
    if case.dtype == "float32":
        return None
    return relative_error(qlinear_in_dtype(case, inputs, ref.device), ref)
