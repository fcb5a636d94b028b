"""The seeded inputs of a linear case: activations and weights of outputs of order one."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...instruments.roofline import TORCH_DTYPES
from .cases import LinearCase


@dataclass(frozen=True)
class LinearInputs:
    x: torch.Tensor
    w: torch.Tensor


def make_inputs(case: LinearCase, device: torch.device, seed: int = 0) -> LinearInputs:
    """Standard-normal activations and weights scaled by K**-0.5 (outputs of order one), from a fixed seed."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = TORCH_DTYPES[case.dtype]
    x = torch.randn((case.m, case.k), generator=gen, device=device, dtype=dtype)
    w = torch.randn((case.n, case.k), generator=gen, device=device, dtype=torch.float32)
    return LinearInputs(x, w.mul_(case.k ** -0.5).to(dtype))
