"""Naive MLA decode: the attention module's naive math (fp32 scores and softmax, materialised) over the latent as
key and its first v_dim dims as value; a paged latent cache is gathered first, an fp8 latent dequantized to q's dtype
(after the gather), inside the call."""

from __future__ import annotations

import torch

from ..attention.fp8 import dequantize
from ..attention.naive import naive_attention, scores_fp32
from ..attention.paged import gatherer
from ..registry import Impl, PlannedCall, add_builtin
from .request import MLARequest, value_request

DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})


def _plan(req: MLARequest) -> PlannedCall:
    def decoded(latent: torch.Tensor) -> torch.Tensor:  # fp8 codes x the latent's scale, rounded to q's dtype
        return dequantize(latent, req.latent_scale, req.dtype, 1) if req.kv_fp8 else latent

    label = "fp8-dequant+" if req.kv_fp8 else ""
    if req.paged:
        gather = gatherer(req.attention)  # one latent pool: gathered once
        return PlannedCall("naive", f"gather+{label}torch-matmul",
                           lambda: naive_attention(value_request(req, decoded(gather()[0]))))
    return PlannedCall("naive", f"{label}torch-matmul",
                       lambda: naive_attention(value_request(req, decoded(req.latent))))


NAIVE_MLA = add_builtin(Impl(
    name="naive",
    summary="fp32 scores of q against the latent, fp32 softmax, matmul with the latent's first v_dim dims",
    devices=frozenset({"cpu", "cuda"}),
    dtypes=DTYPES,
    plan=_plan,
    fp8_kv=True,
    backends=lambda device_type: "torch-matmul",
    compute=scores_fp32,  # q and the latent upcast for the scores, the probabilities rounded to the dtype for P.V
    op="mla",
))
