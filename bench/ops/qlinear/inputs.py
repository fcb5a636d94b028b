"""The seeded inputs of a quantized linear case: activations, and weights (outputs of order one) packed."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ....kernels import QuantizedWeight, quantize
from ...instruments.roofline import TORCH_DTYPES
from .cases import QLinearCase


@dataclass(frozen=True)
class QLinearInputs:
    x: torch.Tensor
    qweight: QuantizedWeight


def make_inputs(case: QLinearCase, device: torch.device, seed: int = 0) -> QLinearInputs:
    """Standard-normal activations; standard-normal weights scaled by K**-0.5 in the case's dtype, then packed."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = TORCH_DTYPES[case.dtype]
    x = torch.randn((case.m, case.k), generator=gen, device=device, dtype=dtype)
    w = torch.randn((case.n, case.k), generator=gen, device=device, dtype=torch.float32)
    return QLinearInputs(x, quantize(w.mul_(case.k ** -0.5).to(dtype), case.scheme))
