"""The higher-precision reference of a quantized linear case: x @ the packed weights unpacked (unpack.py, from the
documented layouts, never the kernels' own dequantize), both in fp64 on every device, a block of output channels at
a time: the scheme's quantization error is not the kernel's."""

from __future__ import annotations

import torch

from ..linear.reference import REFERENCE_BYTES
from .cases import QLinearCase
from .inputs import QLinearInputs
from .unpack import unpack


def reference(case: QLinearCase, inputs: QLinearInputs, device: torch.device) -> torch.Tensor:
    """x @ unpack(qweight).T in fp64, unpacking a bounded block of weight rows at a time."""
    rows = max(1, REFERENCE_BYTES // (case.k * torch.float64.itemsize))
    x = inputs.x.to(torch.float64)
    out = torch.empty((case.m, case.n), dtype=torch.float64, device=device)
    for start in range(0, case.n, rows):
        out[:, start:start + rows] = x @ unpack(inputs.qweight, start, start + rows).T
    return out
