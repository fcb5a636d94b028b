"""Allocation of outputs and scratch buffers, with a poison switch that tests use to catch unwritten elements."""

from __future__ import annotations

import contextlib

import torch

_poison: float | None = None


def empty(shape, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialised buffer, or one filled with the poison value inside `poisoned()`."""
    if _poison is None:
        return torch.empty(shape, dtype=dtype, device=device)
    return torch.full(shape, _poison, dtype=dtype, device=device)


def empty_like(t: torch.Tensor) -> torch.Tensor:
    return empty(t.shape, dtype=t.dtype, device=t.device)


@contextlib.contextmanager
def poisoned(value: float = float("nan")):
    """Fill every buffer the kernels allocate with `value` (NaN by default) while the block runs."""
    global _poison
    previous, _poison = _poison, value
    try:
        yield
    finally:
        _poison = previous
