"""The compiled elementwise kinds: the eager impl's bodies under torch.compile (Inductor), each one generated loop
(rmsnorm's square, mean, rsqrt and scale in one pass; SiLU and the product in one; add_rmsnorm's residual add and
norm in one, vLLM's fused_add_rms_norm), in the eager impl's precision."""

from __future__ import annotations

import torch

from .. import inductor
from ..errors import Unsupported
from ..registry import Impl, PlannedCall, add_builtin, dtype_name
from .eager import EAGER
from .request import ElementwiseRequest

KINDS = ("rmsnorm", "residual_add", "silu_mul", "add_rmsnorm")


def _plan(req: ElementwiseRequest) -> PlannedCall:
    if req.kind not in KINDS:
        raise Unsupported(f"compiled serves {', '.join(KINDS)}, not {req.kind}")
    return inductor.compiled_call("compiled", inductor.backend(req.device_type), EAGER[req.kind], *req.tensors,
                                  **req.options)


COMPILED_ELEMENTWISE = add_builtin(Impl(
    name="compiled",
    summary="the eager bodies under torch.compile (Inductor): rmsnorm, residual_add, silu_mul, add_rmsnorm fused",
    devices=frozenset({"cpu", "cuda"}),
    dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32}),
    plan=_plan,
    unavailable=inductor.why_unavailable,
    backends=inductor.backend,
    op="elementwise",
    compute=lambda device_type, dtype, fields: dtype_name(torch.promote_types(dtype, torch.float32)),
    compiles=True,
))
