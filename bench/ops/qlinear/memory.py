"""What a quantized linear (case, impl) charges in memory (inputs, reference, each impl's scratch) for the fit check."""

from __future__ import annotations

import torch

from ....kernels.linear.triton_linear import MAX_SPLIT_K, choose_path
from ...instruments.memory.device_memory import CHECK_COPIES, UNKNOWN_INPUT_COPIES, fit_reason
from ..linear.reference import REFERENCE_BYTES, reference_dtype
from .cases import ELEMENT_BYTES, QLinearCase, weight_bytes


def _elem(case: QLinearCase) -> int:
    return ELEMENT_BYTES[case.dtype]


def _inputs(case: QLinearCase) -> int:
    return int(weight_bytes(case)) + _elem(case) * case.m * case.k


def case_bytes(case: QLinearCase, device: torch.device) -> int:
    """x and the packed weight, the float weight it was packed from (while quantizing), the baseline's dequantized
    weights, the reference output, its upcast x and its bounded scratch."""
    ref = torch.finfo(reference_dtype(device)).bits // 8
    dense = _elem(case) * case.n * case.k
    return _inputs(case) + 2 * dense + ref * (case.m * case.n + case.m * case.k) + REFERENCE_BYTES


SCRATCH = {
    "naive": lambda case: _elem(case) * case.n * case.k,  # the dequantized weight
    "torch": lambda case: int(weight_bytes(case)) + _elem(case) * case.m * case.k,  # the repacked weight, padded x
    "triton": lambda case: 4 * MAX_SPLIT_K * case.m * case.n if choose_path(case.m) == "gemv" else 0,
}


def impl_bytes(case: QLinearCase, impl: str, device: torch.device) -> int:
    """The output, the impl's scratch and the check's temporaries."""
    rule = SCRATCH.get(impl)
    scratch = rule(case) if rule else UNKNOWN_INPUT_COPIES * _inputs(case)
    ref = torch.finfo(reference_dtype(device)).bits // 8
    return _elem(case) * case.m * case.n + scratch + CHECK_COPIES * ref * case.m * case.n


def does_not_fit(case: QLinearCase, impl: str, device: torch.device, *, resident: bool = False,
                 free: int | None = None) -> str | None:
    note = "" if impl in SCRATCH else f"; {impl} is charged its output plus {UNKNOWN_INPUT_COPIES}x the inputs"
    return fit_reason(impl, impl_bytes(case, impl, device), case_bytes(case, device), device,
                      resident=resident, free=free, note=note)
