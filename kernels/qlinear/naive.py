"""Naive quantized linear layer: dequantize the whole weight to the activation dtype, then F.linear (what a model
without a quantized kernel does: it pays for writing and re-reading the dequantized copy)."""

from __future__ import annotations

import torch.nn.functional as F

from ..registry import Impl, PlannedCall, add_builtin
from .request import ACTIVATION_DTYPES, QLinearRequest


def _plan(req: QLinearRequest) -> PlannedCall:
    return PlannedCall("naive", "dequantize+F.linear", lambda: F.linear(req.x, req.qweight.dequantize(req.dtype)))


NAIVE_QLINEAR = add_builtin(Impl(
    name="naive",
    summary="dequantize the packed weight to the activation dtype, then F.linear (the vendor BLAS)",
    devices=frozenset({"cpu", "cuda"}),
    dtypes=frozenset(ACTIVATION_DTYPES),
    plan=_plan,
    backends=lambda device_type: "dequantize+F.linear",
    op="qlinear",
))
