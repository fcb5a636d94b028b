"""The seeded inputs of an elementwise case, and what kv_append writes in place poisoned before a judged call."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...instruments.roofline import TORCH_DTYPES
from .cases import ElementwiseCase


@dataclass(frozen=True)
class ElementwiseInputs:
    """The kind's tensors in its calling order."""

    tensors: tuple


def make_inputs(case: ElementwiseCase, device: torch.device, seed: int = 0) -> ElementwiseInputs:
    """Standard-normal tensors from a fixed seed (the rmsnorm weight about 1), positions the last m of cache_len."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = TORCH_DTYPES[case.dtype]

    def draw(*shape):
        return torch.randn(shape, generator=gen, device=device, dtype=dtype)

    m, n, d = case.m, case.n, case.head_dim
    positions = torch.arange(case.positions_start, case.positions_start + m, device=device)
    if case.kind == "rmsnorm":
        return ElementwiseInputs((draw(m, n), draw(n).add_(1)))
    if case.kind == "residual_add":
        return ElementwiseInputs((draw(m, n), draw(m, n)))
    if case.kind == "add_rmsnorm":
        return ElementwiseInputs((draw(m, n), draw(m, n), draw(n).add_(1)))
    if case.kind == "silu_mul":
        return ElementwiseInputs((draw(m, 2 * n),))
    if case.kind == "rotary":
        return ElementwiseInputs((draw(m, n, d), draw(m, case.kv_heads, d), positions))
    if case.kind == "kv_append":
        return ElementwiseInputs((draw(case.cache_len, n, d), draw(case.cache_len, n, d), draw(m, n, d),
                                  draw(m, n, d), positions))
    return ElementwiseInputs((draw(m, n),))


def poison_written(case: ElementwiseCase, inputs: ElementwiseInputs) -> None:
    """NaN in the cache rows kv_append writes (it only writes them, never reads them), so that a call which skips
    any of them fails its check whatever an earlier call wrote there; the other kinds write their own outputs."""
    if case.kind == "kv_append":
        cache_k, cache_v, _, _, positions = inputs.tensors
        cache_k.index_fill_(0, positions, float("nan"))
        cache_v.index_fill_(0, positions, float("nan"))
