"""The low-precision baseline of a quantized linear case: the weights unpacked (unpack.py, never the kernels'
dequantize) and rounded to the activation dtype, then the linear baseline's product (exact fp32 products, fp32
accumulation, the output rounded once), written independently of every registered impl (no F.linear, no torch
int4/int8 op, no Triton)."""

from __future__ import annotations

import torch

from ...instruments.gate import relative_error
from ...instruments.roofline import TORCH_DTYPES
from ..linear.inputs import LinearInputs
from ..linear.reference import REFERENCE_BYTES, blocked_product
from .cases import QLinearCase
from .inputs import QLinearInputs
from .unpack import unpack

# The most this baseline errs, in units of roundoff: the weights and the output each rounded once (0.7-1.2 u on the
# CPU decode-quant suite).
CAP_UNITS = 2.0


def qlinear_in_dtype(case: QLinearCase, inputs: QLinearInputs, device: torch.device) -> torch.Tensor:
    """x @ w.T with w the packed weights unpacked and rounded to the case's dtype, as a kernel that dequantizes to
    the activation dtype computes it."""
    dtype = TORCH_DTYPES[case.dtype]
    w = torch.empty((case.n, case.k), dtype=dtype, device=device)
    rows = max(1, REFERENCE_BYTES // (case.k * torch.float64.itemsize))  # the fp64 unpacking a block at a time
    for start in range(0, case.n, rows):
        w[start:start + rows] = unpack(inputs.qweight, start, start + rows)
    dense = LinearInputs(inputs.x, w)
    return blocked_product(case, dense, device, torch.float32, rounding=dtype)


def baseline_error(case: QLinearCase, inputs: QLinearInputs, ref: torch.Tensor) -> float | None:
    """The relative error of qlinear_in_dtype (None in fp32, which has a fixed limit)."""
    if case.dtype == "float32":
        return None
    return relative_error(qlinear_in_dtype(case, inputs, ref.device), ref)
