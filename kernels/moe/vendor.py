"""The vendor routed experts: torch._grouped_mm over the slots sorted by expert, one grouped GEMM per projection.

What serves it (torch 2.13): on CUDA in bfloat16 on sm_90 and sm_100, CUTLASS's grouped GEMM (no host sync); in any
other dtype or GPU, and on the host in every dtype, its fallback, one mm per expert group over `offs` read back to
the host. Its operands' strides must be multiples of 16 bytes (K and N multiples of 8 in 16-bit dtypes, of 4 in
fp32): other shapes are unsupported rather than padded on every call. Packed (quantized) experts are unsupported:
torch 2.13 has no grouped weight-only GEMM.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import Unsupported
from ..registry import Impl, PlannedCall, add_builtin
from .request import MOE_DTYPES, MoeRequest
from .sorting import sort_by_expert

ALIGN_BYTES = 16


def backend(device_type: str, dtype: torch.dtype, device=None) -> str:
    """The concrete path torch 2.13 takes: CUTLASS's grouped GEMM or the fallback's mm per group."""
    if device_type == "cuda" and dtype == torch.bfloat16 and torch.cuda.is_available():
        major = torch.cuda.get_device_capability(device)[0]
        if major in (9, 10):
            return "torch._grouped_mm:cutlass"
    return "torch._grouped_mm:mm-per-group"


def grouped_moe(req: MoeRequest) -> torch.Tensor:
    order, ends = sort_by_expert(req.topk_ids, req.experts)
    rows = req.x[order // req.top_k]  # each slot's token, in expert order
    gate, up = torch._grouped_mm(rows, req.w_gate_up.transpose(1, 2), offs=ends).chunk(2, dim=-1)
    y = torch._grouped_mm(F.silu(gate) * up, req.w_down.transpose(1, 2), offs=ends)
    weighted = torch.empty((req.slots, req.k), dtype=torch.float32, device=req.x.device)
    weighted[order] = y.float() * req.topk_weights.reshape(-1)[order, None]
    return weighted.view(req.m, req.top_k, req.k).sum(dim=1).to(req.dtype)


def _plan(req: MoeRequest) -> PlannedCall:
    if req.scheme:
        raise Unsupported(f"torch has no grouped weight-only GEMM: torch._grouped_mm multiplies float (or fp8 by fp8, "
                          f"W8A8) operands and takes no {req.scheme} expert stack")
    if not hasattr(torch, "_grouped_mm"):
        raise Unsupported(f"torch {torch.__version__} has no torch._grouped_mm")
    unit = ALIGN_BYTES // req.x.element_size()
    if req.k % unit or req.n % unit:
        raise Unsupported(f"torch._grouped_mm needs row strides in multiples of {ALIGN_BYTES} bytes: K and N "
                          f"multiples of {unit} in {str(req.dtype).removeprefix('torch.')}, got K = {req.k}, "
                          f"N = {req.n}")
    return PlannedCall("torch", backend(req.device_type, req.dtype, req.x.device), lambda: grouped_moe(req))


TORCH_MOE = add_builtin(Impl(
    name="torch",
    summary="torch._grouped_mm per projection over the slots sorted by expert (CUTLASS in bf16 on sm_90/100, "
            "else an mm per group)",
    devices=frozenset({"cpu", "cuda"}),
    dtypes=frozenset(MOE_DTYPES),
    plan=_plan,
    backends=lambda device_type: ("torch._grouped_mm:cutlass (bf16 on sm_90/100), :mm-per-group otherwise"
                                  if device_type == "cuda" else "torch._grouped_mm:mm-per-group"),
    op="moe",
))
