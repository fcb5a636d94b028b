"""Naive linear layer: the textbook multiply-and-sum, no BLAS call, a bounded slice of the product at a time."""

from __future__ import annotations

import torch

from ..registry import Impl, PlannedCall, add_builtin, dtype_name
from .request import LinearRequest

# Each step materialises at most this many products (rows x cols x K elements of x[i, k] * w[j, k]).
STEP_ELEMENTS = 1 << 22


def naive_linear(req: LinearRequest) -> torch.Tensor:
    """out[i, j] = sum_k x[i, k] * w[j, k], accumulated in fp32 (fp64 for fp64 inputs), elementwise ops only."""
    x, w = req.x, req.w
    acc_dtype = torch.promote_types(x.dtype, torch.float32)
    out = torch.empty((req.m, req.n), dtype=x.dtype, device=x.device)
    cols = max(1, min(req.n, STEP_ELEMENTS // req.k))
    rows = max(1, min(req.m, STEP_ELEMENTS // (req.k * cols)))
    for i in range(0, req.m, rows):
        xi = x[i:i + rows].to(acc_dtype)[:, None, :]
        for j in range(0, req.n, cols):
            wj = w[j:j + cols].to(acc_dtype)[None, :, :]
            out[i:i + rows, j:j + cols] = (xi * wj).sum(dim=-1)
    return out


def _plan(req: LinearRequest) -> PlannedCall:
    return PlannedCall("naive", "elementwise-sum", lambda: naive_linear(req))


NAIVE_LINEAR = add_builtin(Impl(
    name="naive",
    summary="multiply-and-sum with elementwise torch ops, no BLAS; bounded slices of the [M, N, K] products",
    devices=frozenset({"cpu", "cuda"}),
    dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64}),
    plan=_plan,
    backends=lambda device_type: "elementwise-sum",
    op="linear",
    compute=lambda device_type, dtype, fields: dtype_name(torch.promote_types(dtype, torch.float32)),
))
