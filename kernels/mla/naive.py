"""Naive MLA decode: the attention module's naive math (fp32 scores and softmax, materialised) over the latent as
key and its first v_dim dims as value; a paged latent cache is gathered first, an fp8 latent dequantized (after the
gather: the key in fp32, the value in q's dtype), inside the call."""

from __future__ import annotations

import dataclasses

import torch

from ..attention.fp8 import dequantize
from ..attention.naive import naive_attention, scores_fp32
from ..attention.paged import gatherer
from ..attention.request import AttentionRequest
from ..registry import Impl, PlannedCall, add_builtin
from .request import MLARequest, value_request

DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})


def _request(req: MLARequest, latent: torch.Tensor) -> AttentionRequest:
    """The attention request over a contiguous latent; an fp8 one decoded as attention's naive decodes K and V: the
    key in the scores' precision (fp32), the value (its first v_dim dims) rounded to q's dtype."""
    if not req.kv_fp8:
        return value_request(req, latent)
    key = dequantize(latent, req.latent_scale, torch.promote_types(req.dtype, torch.float32), 1)
    return dataclasses.replace(value_request(req, key), v=key[..., :req.v_dim].to(req.dtype))


def _plan(req: MLARequest) -> PlannedCall:
    label = "fp8-dequant+" if req.kv_fp8 else ""
    if req.paged:
        gather = gatherer(req.attention)  # one latent pool: gathered once
        return PlannedCall("naive", f"gather+{label}torch-matmul",
                           lambda: naive_attention(_request(req, gather()[0])))
    return PlannedCall("naive", f"{label}torch-matmul", lambda: naive_attention(_request(req, req.latent)))


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
