"""The higher-precision reference of an MLA decode case: the attention operator's blocked online-softmax math (bench,
independent of every impl) over the latent as key and its first Dv dims as value, at the case's scale."""

from __future__ import annotations

import torch

from ..attention.reference import blocked_attention, reference_dtype
from .cases import MLACase
from .inputs import MLAInputs


def reference(case: MLACase, inputs: MLAInputs, device: torch.device) -> torch.Tensor:
    """MLA decode in higher precision (fp64 on the host, fp32 without TF32 on a GPU), in bounded memory."""
    return blocked_attention(case.attention, inputs.as_attention(case), device,
                             reference_dtype(case.attention, device), scale=case.scale)
