"""The compiled routed experts: the gather + bmm form a user writes for torch.compile (static shapes, no host sync):
each (token, expert) slot gathers its expert's weights and runs a batched GEMV, then the weighted slots are summed
per token in fp32. Every slot reads its expert's weights whole, so the form reads top_k x M experts' bytes where a
grouped kernel reads the touched experts once; past GATHER_BYTES of gathered weights it is unsupported, and so are
packed (quantized) experts."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import inductor
from ..errors import Unsupported
from ..registry import Impl, PlannedCall, add_builtin
from .request import MOE_DTYPES, MoeRequest

GATHER_BYTES = 1 << 30


def _gather_bmm(x, w_gate_up, w_down, topk_weights, topk_ids):
    m, k = x.shape
    top_k = topk_ids.shape[1]
    ids = topk_ids.reshape(-1).long()
    rows = x[:, None, :].expand(m, top_k, k).reshape(m * top_k, 1, k)
    gate, up = torch.bmm(rows, w_gate_up[ids].transpose(1, 2))[:, 0].chunk(2, dim=-1)
    y = torch.bmm((F.silu(gate) * up)[:, None, :], w_down[ids].transpose(1, 2))[:, 0]
    return (y.float() * topk_weights.reshape(-1, 1)).view(m, top_k, k).sum(dim=1).to(x.dtype)


def _plan(req: MoeRequest) -> PlannedCall:
    if req.scheme:
        raise Unsupported(f"compiled's gather + bmm gathers every slot's expert weights as float tensors: {req.scheme} "
                          "experts would be dequantized whole on every call (naive dequantizes the touched experts, "
                          "triton decodes them in its K loop)")
    gathered = req.slots * 3 * req.n * req.k * req.x.element_size()
    if gathered > GATHER_BYTES:
        raise Unsupported(f"compiled's gather + bmm would gather {gathered / 2**30:.1f} GiB of expert weights "
                          f"({req.slots} slots); past {GATHER_BYTES >> 30} GiB a grouped kernel serves this")
    return inductor.compiled_call("compiled", inductor.backend(req.device_type) + ":gather+bmm", _gather_bmm, req.x,
                                  req.w_gate_up, req.w_down, req.topk_weights, req.topk_ids)


COMPILED_MOE = add_builtin(Impl(
    name="compiled",
    summary="gather + bmm per (token, expert) slot under torch.compile (Inductor), fp32 sum of the weighted slots",
    devices=frozenset({"cpu", "cuda"}),
    dtypes=frozenset(MOE_DTYPES),
    plan=_plan,
    unavailable=inductor.why_unavailable,
    backends=lambda device_type: inductor.backend(device_type) + ":gather+bmm",
    op="moe",
    compiles=True,
))
