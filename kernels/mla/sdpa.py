"""MLA decode through PyTorch SDPA: the latent as key and as value, all query heads against its one head (MQA), the
output's first v_dim dims kept. SDPA's flash kernels need the value as wide as the key, so the value is the whole
latent: the P.V product computes Dqk - Dv more columns (12.5% at 576/512) and the output is copied out of them."""

from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend

from ..attention.flash import sdpa_route
from ..attention.fp8 import SDPA_REFUSAL
from ..registry import Impl, PlannedCall, add_builtin
from .request import MLARequest

# the host's flash kernel takes any head dim; on CUDA FlashAttention-2 stops at 256, the efficient kernel does not
BACKENDS = {"cpu": (SDPBackend.FLASH_ATTENTION, "sdpa-flash"), "cuda": (SDPBackend.EFFICIENT_ATTENTION,
                                                                          "sdpa-efficient")}


def _plan(req: MLARequest) -> PlannedCall:
    backend, label = BACKENDS[req.device_type]
    call = sdpa_route(req.attention, "torch", backend, label, masks=req.device_type == "cuda")
    return PlannedCall("torch", f"{call.backend}+wide-v", lambda: call.run()[..., :req.v_dim].contiguous())


SDPA_MLA = add_builtin(Impl(
    name="torch",
    summary="PyTorch SDPA (flash on the host, efficient on CUDA), the latent as key and value, MQA over its one head",
    devices=frozenset({"cpu", "cuda"}),
    dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32}),
    plan=_plan,
    backends=lambda device_type: BACKENDS.get(device_type, (None, ""))[1] + "+wide-v",
    fp8_refusal=SDPA_REFUSAL,
    op="mla",
))
