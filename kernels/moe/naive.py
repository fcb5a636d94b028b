"""Naive routed experts: a loop over the experts that have tokens, gathering each one's tokens, its gate/up and
down projections as two F.linear calls, the weighted outputs added into an fp32 sum (what an eager model does;
fp64 inputs sum in fp64). Packed experts: each touched expert dequantized to x's dtype before its F.linear calls
(never the untouched ones)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..registry import Impl, PlannedCall, add_builtin
from .request import REQUEST_DTYPES, MoeRequest


def naive_moe(req: MoeRequest) -> torch.Tensor:
    """sum over a token's top-k experts of its weight x down(SiLU(gate) * up), one expert at a time."""
    out = torch.zeros((req.m, req.k), dtype=torch.promote_types(req.dtype, torch.float32), device=req.x.device)
    hit = torch.zeros(req.experts, dtype=torch.bool, device=req.x.device)
    hit[req.topk_ids.reshape(-1).long()] = True
    for expert in hit.nonzero().flatten().tolist():  # reads the touched experts back to the host
        tokens, slot = torch.where(req.topk_ids == expert)
        w_gate_up, w_down = req.expert_weights(expert)
        gate, up = F.linear(req.x[tokens], w_gate_up).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, w_down)
        out.index_add_(0, tokens, y.to(out.dtype) * req.topk_weights[tokens, slot, None])
    return out.to(req.dtype)


def _plan(req: MoeRequest) -> PlannedCall:
    backend = "expert-loop+dequantize+F.linear" if req.scheme else "expert-loop+F.linear"
    return PlannedCall("naive", backend, lambda: naive_moe(req))


NAIVE_MOE = add_builtin(Impl(
    name="naive",
    summary="a loop over the touched experts: gather its tokens, F.linear gate/up and down, weighted fp32 sum",
    devices=frozenset({"cpu", "cuda"}),
    dtypes=frozenset(REQUEST_DTYPES),
    plan=_plan,
    backends=lambda device_type: "expert-loop+F.linear, expert-loop+dequantize+F.linear (packed experts)",
    op="moe",
))
