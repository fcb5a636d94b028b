"""What an elementwise (case, impl) charges in memory (inputs, reference, each impl's scratch) for the fit check."""

from __future__ import annotations

import torch

from ...instruments.memory.device_memory import CHECK_COPIES, UNKNOWN_INPUT_COPIES, fit_reason
from ..linear.cases import ELEMENT_BYTES
from .cases import ElementwiseCase, tensor_elements
from .reference import reference_dtype

REFERENCE_TEMPS = 3  # the reference's upcast inputs and its intermediates, in input-sized buffers
# fp32 temporaries of the eager torch math, in multiples of the output (rmsnorm's fp32 x and its square, ...)
TORCH_TEMPS = {"rmsnorm": 3, "residual_add": 0, "silu_mul": 1, "rotary": 4, "kv_append": 0, "greedy_pick": 0,
               "add_rmsnorm": 2}


def _int_bytes(case: ElementwiseCase) -> int:
    return 8 * case.m if case.kind in ("rotary", "kv_append") else 0  # int64 positions


def case_bytes(case: ElementwiseCase, device: torch.device) -> int:
    """The inputs as allocated (kv_append: the whole caches), the baseline's output in the dtype, the reference and
    its temporaries (the baseline's fp32 ones come after them, and are no wider)."""
    elem, ref = ELEMENT_BYTES[case.dtype], reference_dtype(device).itemsize
    read, written = tensor_elements(case)
    allocated = read + written + (2 * case.cache_len * case.n * case.head_dim if case.kind == "kv_append" else 0)
    ref_out = case.m if case.kind == "greedy_pick" else written
    scratch = 0 if case.kind == "greedy_pick" else REFERENCE_TEMPS * read
    return elem * allocated + _int_bytes(case) + ref * (ref_out + scratch)


def impl_bytes(case: ElementwiseCase, impl: str, device: torch.device) -> int:
    """The impl's output and scratch (a plugin: UNKNOWN_INPUT_COPIES x the inputs), the gate's view and copies."""
    elem, ref = ELEMENT_BYTES[case.dtype], reference_dtype(device).itemsize
    read, written = tensor_elements(case)
    output = 8 * case.m if case.kind == "greedy_pick" else (0 if case.kind == "kv_append" else elem * written)
    if impl == "torch":
        scratch = 4 * TORCH_TEMPS[case.kind] * written
    else:
        scratch = UNKNOWN_INPUT_COPIES * (elem * read + _int_bytes(case))
    viewed = elem * (case.m if case.kind == "greedy_pick" else written)
    return output + scratch + viewed + CHECK_COPIES * ref * (case.m if case.kind == "greedy_pick" else written)


def does_not_fit(case: ElementwiseCase, impl: str, device: torch.device, *, resident: bool = False,
                 free: int | None = None) -> str | None:
    note = "" if impl == "torch" else f"; {impl} is charged its output plus {UNKNOWN_INPUT_COPIES}x the inputs"
    return fit_reason(impl, impl_bytes(case, impl, device), case_bytes(case, device), device,
                      resident=resident, free=free, note=note)
