"""MLA decode through FlexAttention: the latent as key, its first v_dim dims as value (flex takes a value narrower
than the key, so nothing is computed past v_dim, unlike SDPA's wide value), all query heads against its one head;
paged latents read in place (the attention module's flex planning, masks and block masks)."""

from __future__ import annotations

import torch

from .. import inductor
from ..attention.flex import plan_flex, why_unavailable
from ..attention.fp8 import FLEX_REFUSAL
from ..registry import Impl, PlannedCall, add_builtin
from .request import MLARequest


def _plan(req: MLARequest) -> PlannedCall:
    latent = req.latent
    return plan_flex(req.attention, "flex", v=latent[..., :req.v_dim])


FLEX_MLA = add_builtin(Impl(
    name="flex",
    summary="FlexAttention compiled by Inductor, the latent as key and its first v_dim dims as value (MQA)",
    devices=frozenset({"cpu", "cuda"}),
    dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32}),
    plan=_plan,
    unavailable=why_unavailable,
    backends=lambda device_type: inductor.backend(device_type, "flex"),
    fp8_refusal=FLEX_REFUSAL,
    op="mla",
    compiles=True,
))
