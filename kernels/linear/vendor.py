"""The vendor linear layer: torch.nn.functional.linear (cuBLAS/cuBLASLt on CUDA, oneDNN or MKL on the host)."""

from __future__ import annotations

import functools
import re

import torch
import torch.nn.functional as F

from ..registry import Impl, PlannedCall, add_builtin
from .request import LinearRequest


@functools.cache
def host_blas() -> str:
    """Which BLAS serves host matmuls in this torch build, read from its build configuration."""
    match = re.search(r"BLAS_INFO=([A-Za-z0-9_]+)", torch.__config__.show())
    return match.group(1) if match else "blas"


def backend(device_type: str) -> str:
    if device_type == "cuda":
        return f"cublas-{torch.version.cuda}" if torch.version.cuda else "rocblas"
    return f"{host_blas()}{'+onednn' if torch.backends.mkldnn.is_available() else ''}"


def _plan(req: LinearRequest) -> PlannedCall:
    return PlannedCall("torch", backend(req.device_type), lambda: F.linear(req.x, req.w))


TORCH_LINEAR = add_builtin(Impl(
    name="torch",
    summary="torch.nn.functional.linear: the vendor BLAS (cuBLAS on CUDA, oneDNN/MKL on the host)",
    devices=frozenset({"cpu", "cuda"}),
    dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64}),
    plan=_plan,
    backends=backend,
    op="linear",
))
