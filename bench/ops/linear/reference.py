"""Inputs, the float64/float32 reference, the low-precision baseline and the memory charge of a linear case."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ....kernels.linear.naive import STEP_ELEMENTS
from ....kernels.linear.triton_linear import MAX_SPLIT_K, choose_path
from ...instruments.device_memory import CHECK_COPIES, UNKNOWN_INPUT_COPIES, fit_reason
from ...instruments.gate import relative_error
from ...instruments.roofline import TORCH_DTYPES
from .cases import ELEMENT_BYTES, LinearCase

# The reference upcasts this many weight rows at a time, so its scratch stays bounded.
REFERENCE_BYTES = 1 << 28


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


def reference_dtype(device: torch.device) -> torch.dtype:
    return torch.float64 if device.type == "cpu" else torch.float32


def reference(case: LinearCase, inputs: LinearInputs, device: torch.device) -> torch.Tensor:
    """x @ w.T in higher precision (TF32 off), a block of weight rows at a time."""
    dtype = reference_dtype(device)
    elem = torch.finfo(dtype).bits // 8
    rows = max(1, REFERENCE_BYTES // (case.k * elem))
    x = inputs.x.to(dtype)
    out = torch.empty((case.m, case.n), dtype=dtype, device=device)
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for start in range(0, case.n, rows):
            out[:, start:start + rows] = x @ inputs.w[start:start + rows].to(dtype).T
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    return out


def baseline_error(case: LinearCase, inputs: LinearInputs, ref: torch.Tensor) -> float | None:
    """The error of the same product done by the vendor in the case's dtype (None in fp32: a fixed limit)."""
    if case.dtype == "float32":
        return None
    return relative_error(F.linear(inputs.x, inputs.w), ref)


def _elem(case: LinearCase) -> int:
    return ELEMENT_BYTES[case.dtype]


def case_bytes(case: LinearCase, device: torch.device) -> int:
    """x and w, the upcast reference output and its bounded scratch."""
    ref = torch.finfo(reference_dtype(device)).bits // 8
    return _elem(case) * (case.m * case.k + case.n * case.k) + ref * (case.m * case.n + case.m * case.k) \
        + REFERENCE_BYTES


SCRATCH = {
    "naive": lambda case: 4 * 2 * STEP_ELEMENTS,  # one slice of fp32 products and its sum
    "torch": lambda case: 0,
    # split-K partials on the GEMV path only, at most MAX_SPLIT_K of them (the GEMM writes the output alone)
    "triton": lambda case: 4 * MAX_SPLIT_K * case.m * case.n if choose_path(case.m) == "gemv" else 0,
}


def impl_bytes(case: LinearCase, impl: str, device: torch.device) -> int:
    """The output, the impl's scratch and the check's temporaries."""
    rule = SCRATCH.get(impl)
    scratch = rule(case) if rule else UNKNOWN_INPUT_COPIES * _elem(case) * (case.m * case.k + case.n * case.k)
    ref = torch.finfo(reference_dtype(device)).bits // 8
    return _elem(case) * case.m * case.n + scratch + CHECK_COPIES * ref * case.m * case.n


def does_not_fit(case: LinearCase, impl: str, device: torch.device, *, resident: bool = False,
                 free: int | None = None) -> str | None:
    note = "" if impl in SCRATCH else f"; {impl} is charged its output plus {UNKNOWN_INPUT_COPIES}x the inputs"
    return fit_reason(impl, impl_bytes(case, impl, device), case_bytes(case, device), device,
                      resident=resident, free=free, note=note)
