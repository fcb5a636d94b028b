"""The compiled linear layer: F.linear under torch.compile (Inductor), what a compiled model's projection runs (the
host's Inductor calls the vendor GEMM as an extern kernel unless max-autotune picks its own C++ template)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import inductor
from ..registry import Impl, PlannedCall, add_builtin
from .request import LinearRequest


def _linear(x, w):
    return F.linear(x, w)


def _plan(req: LinearRequest) -> PlannedCall:
    return inductor.compiled_call("compiled", inductor.backend(req.device_type), _linear, req.x, req.w)


COMPILED_LINEAR = add_builtin(Impl(
    name="compiled",
    summary="F.linear under torch.compile (Inductor, fullgraph, static shapes)",
    devices=frozenset({"cpu", "cuda"}),
    dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32}),
    plan=_plan,
    unavailable=inductor.why_unavailable,
    backends=inductor.backend,
    op="linear",
    compiles=True,
))
