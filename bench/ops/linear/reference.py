"""The higher-precision reference of a linear case: x @ w.T a block of weight rows at a time, which the
low-precision baseline (baseline.py) also runs, in fp32 with its output rounded."""

from __future__ import annotations

import torch

from .cases import LinearCase
from .inputs import LinearInputs

# The reference upcasts this many weight rows at a time, so its scratch stays bounded.
REFERENCE_BYTES = 1 << 28


def reference_dtype(device: torch.device) -> torch.dtype:
    """fp64 on every device: in fp32 on a GPU the reference was the same cuBLAS SGEMM as F.linear (its error 0)."""
    return torch.float64


def blocked_product(case: LinearCase, inputs: LinearInputs, device: torch.device, dtype: torch.dtype,
                    rounding: torch.dtype | None = None) -> torch.Tensor:
    """x @ w.T with both operands upcast to `dtype` (TF32 off), a block of weight rows at a time; with `rounding`,
    each block of the output is rounded to that dtype as it is written (the result is in that dtype)."""
    rows = max(1, REFERENCE_BYTES // (case.k * dtype.itemsize))
    x = inputs.x.to(dtype)
    out = torch.empty((case.m, case.n), dtype=rounding or dtype, device=device)
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for start in range(0, case.n, rows):
            out[:, start:start + rows] = x @ inputs.w[start:start + rows].to(dtype).T
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    return out


def reference(case: LinearCase, inputs: LinearInputs, device: torch.device) -> torch.Tensor:
    """x @ w.T in fp64 on every device, a block of weight rows at a time."""
    return blocked_product(case, inputs, device, reference_dtype(device))
