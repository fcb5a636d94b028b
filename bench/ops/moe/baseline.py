"""The low-precision baseline of a routed-experts case: the reference's arithmetic in fp32 on the case dtype's
operands (exact products of two bf16 or fp16 values), rounded where a kernel in that dtype writes (gate and up, their
activated product, each weighted expert output, the sum), written independently of every registered impl (no F.linear
call on the experts, no grouped GEMM, no Triton)."""

from __future__ import annotations

import torch

from ...instruments.gate import relative_error
from ...instruments.roofline import TORCH_DTYPES
from .cases import MoeCase
from .inputs import MoeInputs
from .reference import expert_mixture


def moe_in_dtype(case: MoeCase, inputs: MoeInputs, device: torch.device) -> torch.Tensor:
    return expert_mixture(case, inputs, device, torch.float32, rounding=TORCH_DTYPES[case.dtype])


def baseline_error(case: MoeCase, inputs: MoeInputs, ref: torch.Tensor) -> float | None:
    """The relative error of moe_in_dtype (None in fp32, which has a fixed limit)."""
    if case.dtype == "float32":
        return None
    return relative_error(moe_in_dtype(case, inputs, ref.device), ref)
