"""The low-precision baseline of an elementwise case: each kind's math written out in the case's dtype, with the
rounding points of the eager convention (fp32 inside rmsnorm and the RoPE angles), independently of every
registered impl; its error against the reference sets the gate's fp16/bf16 limit."""

from __future__ import annotations

import torch

from ...instruments.gate import Viewed, relative_error
from .cases import ElementwiseCase
from .inputs import ElementwiseInputs
from .reference import EPS, rotary_angles, rotate


def _rmsnorm(case: ElementwiseCase, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = x.to(torch.float32)
    inverse = 1.0 / torch.sqrt((h * h).sum(dim=1, keepdim=True) / case.n + EPS)
    return w * (h * inverse).to(x.dtype)


def kind_in_dtype(case: ElementwiseCase, inputs: ElementwiseInputs) -> torch.Tensor:
    """The kind's result in the inputs' dtype, laid out as its reference tensor (rotary: q and k flattened and
    joined; kv_append: the appended rows; greedy_pick: the picked logits). Each torch op on low-precision tensors
    computes in fp32 and rounds its result once: the rounding points below are those of a plain decoder."""
    t = inputs.tensors
    if case.kind == "rmsnorm":  # the fp32 normalised rows rounded, then the weight: two roundings
        return _rmsnorm(case, t[0], t[1])
    if case.kind == "add_rmsnorm":  # the sum rounded, then rmsnorm's two roundings on it
        s = t[0] + t[1]
        return torch.cat((_rmsnorm(case, s, t[2]).flatten(), s.flatten()))
    if case.kind == "residual_add":
        return t[0] + t[1]
    if case.kind == "silu_mul":  # silu in fp32 rounded once, then the product
        gate, up = t[0][:, :case.n], t[0][:, case.n:]
        g = gate.to(torch.float32)
        return (g / (1.0 + torch.exp(-g))).to(gate.dtype) * up
    if case.kind == "rotary":  # fp32 angles, cos and sin rounded to the dtype, each product and sum rounded
        q, k, positions = t
        angles = rotary_angles(case, positions)
        cos, sin = angles.cos().to(q.dtype)[:, None, :], angles.sin().to(q.dtype)[:, None, :]
        return torch.cat((rotate(q, cos, sin).flatten(), rotate(k, cos, sin).flatten()))
    if case.kind == "kv_append":  # a copy rounds nothing: the rows as they must land in the caches
        return torch.cat((t[2].flatten(), t[3].flatten()))
    return t[0].amax(dim=1)  # greedy_pick: the row's largest logit, exact in any dtype


def baseline_error(case: ElementwiseCase, inputs: ElementwiseInputs, ref) -> float | None:
    """The relative error of kind_in_dtype against the reference (None in fp32, which has a fixed limit)."""
    if case.dtype == "float32":
        return None
    return relative_error(kind_in_dtype(case, inputs), ref.tensor if isinstance(ref, Viewed) else ref)
