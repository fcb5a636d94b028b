"""The compiled quantized linear layer: the naive impl's dequantize + F.linear as a compiler sees it (torch.compile,
Inductor), which may fuse the unpacking and scaling into one pass over the packed weight before the GEMM."""

from __future__ import annotations

import torch.nn.functional as F

from .. import inductor
from ..registry import Impl, PlannedCall, add_builtin
from .request import ACTIVATION_DTYPES, QLinearRequest


def _dequantize_linear(x, qweight):
    return F.linear(x, qweight.dequantize(x.dtype))


def _plan(req: QLinearRequest) -> PlannedCall:
    return inductor.compiled_call("compiled", inductor.backend(req.device_type) + ":dequantize+linear",
                                  _dequantize_linear, req.x, req.qweight)


COMPILED_QLINEAR = add_builtin(Impl(
    name="compiled",
    summary="dequantize + F.linear under torch.compile (Inductor fuses the unpacking; the GEMM in x's dtype)",
    devices=frozenset({"cpu", "cuda"}),
    dtypes=frozenset(ACTIVATION_DTYPES),
    plan=_plan,
    unavailable=inductor.why_unavailable,
    backends=lambda device_type: inductor.backend(device_type) + ":dequantize+linear",
    op="qlinear",
    compiles=True,
))
