"""Validation of a quantized linear call (x [M, K] times a QuantizedWeight [N, K] transposed) into one request."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..registry import add_operator
from .schemes import SCHEMES, QuantizedWeight, packed_layout

ACTIVATION_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class QLinearRequest:
    """A validated call: activations x [M, K], a packed weight of N output channels, output [M, N] in x's dtype."""

    x: torch.Tensor
    qweight: QuantizedWeight

    @property
    def m(self) -> int:
        return self.x.shape[0]

    @property
    def n(self) -> int:
        return self.qweight.shape[0]

    @property
    def k(self) -> int:
        return self.x.shape[1]

    @property
    def scheme(self) -> str:
        return self.qweight.scheme

    @property
    def device_type(self) -> str:
        return self.x.device.type

    @property
    def dtype(self) -> torch.dtype:
        return self.x.dtype


def expected_layout(qweight: QuantizedWeight) -> dict[str, tuple[int, ...] | None]:
    """The shapes of qdata, scales, zeros and tensor_scale that the scheme's packed layout gives for qweight.shape."""
    return packed_layout(SCHEMES[qweight.scheme], qweight.shape)


def check_qweight(qweight, experts: bool = False) -> None:
    """A one-line ValueError unless qweight holds its scheme's packed layout, contiguous, on one device: one [N, K]
    matrix, or with `experts` a stack [E, N, K]."""
    if not isinstance(qweight, QuantizedWeight):
        raise ValueError(f"qweight: must be a QuantizedWeight from phasebench.kernels.quantize, "
                         f"got {type(qweight).__name__}")
    if qweight.scheme not in SCHEMES:
        raise ValueError(f"qweight: unknown scheme {qweight.scheme!r}, choose from {', '.join(SCHEMES)}")
    info = SCHEMES[qweight.scheme]
    rank = 3 if experts else 2
    if len(qweight.shape) != rank or min(qweight.shape) < 1:
        raise ValueError(f"qweight: must be {'[E, N, K] experts' if experts else 'one [N, K] matrix'}, "
                         f"got shape {qweight.shape}")
    if qweight.qdata.dtype != info.qdata_dtype:
        raise ValueError(f"qweight: {qweight.scheme} packs its weights as {info.qdata_dtype}, "
                         f"got {qweight.qdata.dtype}")
    for name, shape in expected_layout(qweight).items():
        t = getattr(qweight, name)
        if (t is None) != (shape is None) or (t is not None and tuple(t.shape) != shape):
            got = None if t is None else tuple(t.shape)
            raise ValueError(f"qweight: {qweight.scheme} of shape {qweight.shape} must have {name} {shape}, got {got}")
        if t is not None and (not t.is_contiguous() or t.device != qweight.qdata.device):
            raise ValueError(f"qweight: {name} must be contiguous and on qdata's device ({qweight.qdata.device})")
    if info.scale_dtype is None and qweight.scales.dtype not in ACTIVATION_DTYPES:
        raise ValueError(f"qweight: scales must be float16, bfloat16 or float32, got {qweight.scales.dtype}")
    if info.scale_dtype is not None and qweight.scales.dtype != info.scale_dtype:
        raise ValueError(f"qweight: {qweight.scheme} stores its scales as {info.scale_dtype}, "
                         f"got {qweight.scales.dtype}")
    if qweight.tensor_scale is not None and qweight.tensor_scale.dtype != torch.float32:
        raise ValueError(f"qweight: tensor_scale must be float32, got {qweight.tensor_scale.dtype}")


def validate_qlinear(x, qweight) -> QLinearRequest:
    """Check the arguments of `qlinear` and return the request, or raise a one-line ValueError."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x: must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2 or 0 in x.shape:
        raise ValueError(f"x: must be a non-empty [M, K] matrix, got shape {tuple(x.shape)}")
    if x.dtype not in ACTIVATION_DTYPES:
        raise ValueError(f"x: must be float16, bfloat16 or float32, got {x.dtype}")
    if x.stride(-1) != 1:
        raise ValueError(f"x: its last dimension must be contiguous (stride 1), got strides {x.stride()}")
    check_qweight(qweight)
    if qweight.shape[1] != x.shape[1]:
        raise ValueError(f"qweight: must be [N, K] with K = x's {x.shape[1]}, got shape {qweight.shape}")
    if qweight.device != x.device:
        raise ValueError(f"qweight: device must match x ({x.device}), got {qweight.device}")
    return QLinearRequest(x, qweight)


def call_plugin(fn, req: QLinearRequest):
    """A user's quantized linear function, called with the operator's convention."""
    return fn(req.x, req.qweight)


add_operator("qlinear", call_plugin)
