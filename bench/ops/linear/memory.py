"""What a linear (case, impl) charges in memory (inputs, reference, each impl's scratch) for the fit check."""

from __future__ import annotations

import torch

from ....kernels.linear.naive import STEP_ELEMENTS
from ....kernels.linear.triton_linear import MAX_SPLIT_K, choose_path
from ...instruments.device_memory import CHECK_COPIES, UNKNOWN_INPUT_COPIES, fit_reason
from .cases import ELEMENT_BYTES, LinearCase
from .reference import REFERENCE_BYTES, reference_dtype


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
