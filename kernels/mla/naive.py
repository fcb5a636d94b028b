"""Naive MLA decode: the attention module's naive math (fp32 scores and softmax, materialised) over the latent as
key and its first v_dim dims as value; a paged latent cache is gathered first, inside the call."""

from __future__ import annotations

import torch

from ..attention.naive import naive_attention, scores_fp32
from ..attention.paged import gatherer
from ..registry import Impl, PlannedCall, add_builtin
from .request import MLARequest, value_request

DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})


def _plan(req: MLARequest) -> PlannedCall:
    if req.paged:
        gather = gatherer(req.attention)  # one latent pool: gathered once
        return PlannedCall("naive", "gather+torch-matmul", lambda: naive_attention(value_request(req, gather()[0])))
    return PlannedCall("naive", "torch-matmul", lambda: naive_attention(value_request(req, req.latent)))


NAIVE_MLA = add_builtin(Impl(
    name="naive",
    summary="fp32 scores of q against the latent, fp32 softmax, matmul with the latent's first v_dim dims",
    devices=frozenset({"cpu", "cuda"}),
    dtypes=DTYPES,
    plan=_plan,
    backends=lambda device_type: "torch-matmul",
    compute=scores_fp32,  # q and the latent upcast for the scores, the probabilities rounded to the dtype for P.V
    op="mla",
))
