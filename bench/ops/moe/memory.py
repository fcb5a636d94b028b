"""What a routed-experts (case, impl) charges in memory (inputs, reference, each impl's scratch) for the fit check."""

from __future__ import annotations

import torch

from ...instruments.memory.device_memory import CHECK_COPIES, UNKNOWN_INPUT_COPIES, fit_reason
from ..linear.reference import REFERENCE_BYTES, reference_dtype
from .cases import ELEMENT_BYTES, ROUTING_BYTES, MoeCase
from .inputs import weight_bytes


def _elem(case: MoeCase) -> int:
    return ELEMENT_BYTES[case.dtype]


def _inputs(case: MoeCase) -> int:
    return int(weight_bytes(case)) + _elem(case) * case.m * case.k + ROUTING_BYTES * case.m * case.top_k


def case_bytes(case: MoeCase, device: torch.device) -> int:
    """The inputs (every expert's weights), one expert's fp32 draw, and the reference and baseline: one expert's
    upcast weights and a bounded block of its rows each, and their outputs. Packed experts add quantize's fp32
    temporaries of one expert and the unpacking's fp64 ones (codes, values, each weight's scale)."""
    ref = torch.finfo(reference_dtype(device)).bits // 8
    expert = 3 * case.n * case.k
    packing = (4 * 4 + 4 * 8) * expert if case.scheme else 0
    return _inputs(case) + 4 * expert + (ref + 4) * (expert + case.m * case.k) + 2 * REFERENCE_BYTES + packing


def _slots(case: MoeCase) -> int:
    return case.m * case.top_k


SCRATCH = {
    # one expert's gathered tokens (at most M): x rows, gate/up, the activation, its output and its fp32 copy; the
    # fp32 sum
    # packed: one expert dequantized to x's dtype, computed in fp32 (two copies)
    "naive": lambda case: (_elem(case) * case.m * (2 * case.k + 4 * case.n) + 4 * case.m * case.k * 3
                           + ((_elem(case) + 8) * 3 * case.n * case.k if case.scheme else 0)),
    # every slot's x row, gate/up, SiLU and product, output, and the fp32 weighted rows (twice, with the upcast)
    "torch": lambda case: _elem(case) * _slots(case) * (2 * case.k + 5 * case.n) + 8 * _slots(case) * case.k,
    # the intermediate in x's dtype, the fp32 rows per slot and their sum, the padded slot order
    "triton": lambda case: (_elem(case) * _slots(case) * case.n + 4 * _slots(case) * case.k + 4 * case.m * case.k
                            + 8 * (_slots(case) + case.experts * 64)),
}


def impl_bytes(case: MoeCase, impl: str, device: torch.device) -> int:
    """The output, the impl's scratch and the check's temporaries."""
    rule = SCRATCH.get(impl)
    scratch = rule(case) if rule else UNKNOWN_INPUT_COPIES * _inputs(case)
    ref = torch.finfo(reference_dtype(device)).bits // 8
    return _elem(case) * case.m * case.k + scratch + CHECK_COPIES * ref * case.m * case.k


def does_not_fit(case: MoeCase, impl: str, device: torch.device, *, resident: bool = False,
                 free: int | None = None) -> str | None:
    note = "" if impl in SCRATCH else f"; {impl} is charged its output plus {UNKNOWN_INPUT_COPIES}x the inputs"
    return fit_reason(impl, impl_bytes(case, impl, device), case_bytes(case, device), device,
                      resident=resident, free=free, note=note)
