"""What an MLA decode (case, impl) charges in memory (inputs, reference, each impl's scratch) for the fit check."""

from __future__ import annotations

import torch

from ....kernels.mla.triton_mla import MLA_MAX_SPLITS
from ...instruments.memory.device_memory import CHECK_COPIES, UNKNOWN_INPUT_COPIES, fit_reason
from ..attention import memory as attention_memory
from ..attention.cost import ELEMENT_BYTES
from ..attention.reference import reference_dtype, reference_scratch_bytes
from .cases import MLACase


def _rows(case: MLACase) -> int:
    return case.batch * case.q_heads * case.q_len


def output_bytes(case: MLACase) -> int:
    return _rows(case) * case.head_dim_v * ELEMENT_BYTES[case.dtype]


def reference_output_bytes(case: MLACase, device: torch.device) -> int:
    return _rows(case) * case.head_dim_v * reference_dtype(case.attention, device).itemsize


def case_bytes(case: MLACase, device: torch.device) -> int:
    """The inputs (q and the latent, or its pool and table), the reference output, the large-logit check's q and
    reference output, and the reference's bounded scratch."""
    att = case.attention
    latent = attention_memory.input_bytes(att) - attention_memory.output_bytes(att)  # K and V of one head ...
    inputs = attention_memory.output_bytes(att) + latent // 2  # ... of which MLA holds one: q and the latent
    stress = attention_memory.output_bytes(att) + reference_output_bytes(case, device)
    return inputs + reference_output_bytes(case, device) + stress + reference_scratch_bytes(att, device)


def _scratch(case: MLACase, impl: str, device: torch.device) -> int | None:
    """Each built-in impl's scratch beyond its output: naive and torch as the attention impls they run (over a
    576-wide value: an upper bound), Triton its fp32 partials at its split ceiling; None for a plugin."""
    if impl == "triton":
        return MLA_MAX_SPLITS * _rows(case) * (case.head_dim_v + 2) * 4
    if impl in ("naive", "torch"):
        att = case.attention
        full = attention_memory.impl_bytes(att, {"torch": "flash"}.get(impl, impl), device)
        return full - CHECK_COPIES * attention_memory.reference_output_bytes(att, device)
    return None


def does_not_fit(case: MLACase, impl: str, device: torch.device, *, resident: bool = False,
                 free: int | None = None) -> str | None:
    """A one-line reason when the case would not fit in memory here, else None (attention's fit rule)."""
    scratch = _scratch(case, impl, device)
    note = "" if scratch is not None else f"; {impl} is charged its output plus {UNKNOWN_INPUT_COPIES}x the inputs"
    if scratch is None:
        scratch = output_bytes(case) + UNKNOWN_INPUT_COPIES * case_bytes(case, device)
    need = scratch + CHECK_COPIES * reference_output_bytes(case, device)
    return fit_reason(impl, need, case_bytes(case, device), device, resident=resident, free=free, note=note)
