"""The low-precision baseline of a linear case: the same product in the case's dtype, written independently of every
registered impl (neither F.linear nor the naive or Triton kernels), whose error sets the gate's fp16/bf16 limit."""

from __future__ import annotations

import torch

from ...instruments.gate import relative_error
from ...instruments.roofline import TORCH_DTYPES
from .cases import LinearCase
from .inputs import LinearInputs
from .reference import blocked_product

# The most this baseline errs, in units of roundoff: its output rounded once (0.5-1.0 u on the CPU suites).
CAP_UNITS = 2.0


def linear_in_dtype(case: LinearCase, inputs: LinearInputs, device: torch.device) -> torch.Tensor:
    """x @ w.T as a GEMM kernel does it in the case's dtype: the low-precision operands multiplied exactly in fp32
    (a product of two bf16 or fp16 values fits fp32's significand), fp32 accumulation, the output rounded once."""
    return blocked_product(case, inputs, device, torch.float32, rounding=TORCH_DTYPES[case.dtype])


def baseline_error(case: LinearCase, inputs: LinearInputs, ref: torch.Tensor) -> float | None:
    """The relative error of linear_in_dtype (None in fp32, which has a fixed limit)."""
    if case.dtype == "float32":
        return None
    return relative_error(linear_in_dtype(case, inputs, ref.device), ref)
