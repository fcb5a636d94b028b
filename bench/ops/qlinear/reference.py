"""The higher-precision reference of a quantized linear case: x @ the dequantized weights, both in fp64 on the host
(fp32 without TF32 on a GPU), a block of output channels at a time: the scheme's quantization error is not the
kernel's."""

from __future__ import annotations

import torch

from ..linear.reference import REFERENCE_BYTES, reference_dtype
from .cases import QLinearCase
from .inputs import QLinearInputs


def reference(case: QLinearCase, inputs: QLinearInputs, device: torch.device) -> torch.Tensor:
    """x @ qweight.dequantize().T in the reference dtype, dequantizing a bounded block of weight rows at a time."""
    dtype = reference_dtype(device)
    rows = max(1, REFERENCE_BYTES // (case.k * dtype.itemsize))
    x = inputs.x.to(dtype)
    out = torch.empty((case.m, case.n), dtype=dtype, device=device)
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for start in range(0, case.n, rows):
            out[:, start:start + rows] = x @ inputs.qweight.rows(start, start + rows).dequantize(dtype).T
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    return out
