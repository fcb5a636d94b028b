"""Validation of a linear-layer call (x [M, K] times w [N, K] transposed) into one checked request."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..registry import add_operator

LINEAR_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True)
class LinearRequest:
    """A validated call: activations x [M, K], weights w [N, K] (nn.Linear layout), output [M, N]."""

    x: torch.Tensor
    w: torch.Tensor

    @property
    def m(self) -> int:
        return self.x.shape[0]

    @property
    def n(self) -> int:
        return self.w.shape[0]

    @property
    def k(self) -> int:
        return self.x.shape[1]

    @property
    def device_type(self) -> str:
        return self.x.device.type

    @property
    def dtype(self) -> torch.dtype:
        return self.x.dtype


def validate_linear(x, w) -> LinearRequest:
    """Check the arguments of `linear` and return the request, or raise a one-line ValueError."""
    for name, t in (("x", x), ("w", w)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"{name}: must have rank 2 ({'[M, K]' if name == 'x' else '[N, K]'}), "
                             f"got shape {tuple(t.shape)}")
        if t.dtype not in LINEAR_DTYPES:
            raise ValueError(f"{name}: must be a floating dtype (float16/bfloat16/float32/float64), got {t.dtype}")
        if 0 in t.shape:
            raise ValueError(f"{name}: must not have an empty dimension, got shape {tuple(t.shape)}")
        if t.stride(-1) != 1:
            raise ValueError(f"{name}: its last dimension must be contiguous (stride 1), got strides {t.stride()}")
    if w.dtype != x.dtype:
        raise ValueError(f"w: dtype must match x ({x.dtype}), got {w.dtype}")
    if w.device != x.device:
        raise ValueError(f"w: device must match x ({x.device}), got {w.device}")
    if w.shape[1] != x.shape[1]:
        raise ValueError(f"w: must be [N, K] with K = x's {x.shape[1]}, got shape {tuple(w.shape)}")
    return LinearRequest(x, w)


def call_plugin(fn, req: LinearRequest):
    """A user's linear function, called with the operator's convention."""
    return fn(req.x, req.w)


add_operator("linear", call_plugin)
