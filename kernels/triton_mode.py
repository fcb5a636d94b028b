"""Decides, before any Triton kernel is defined, whether Triton compiles or runs in its interpreter."""

from __future__ import annotations

import os
import sys

import torch

# Triton decides interpreter or compiler when each @triton.jit function is defined, its own
# standard library included, so the variable must be set before `triton` is first imported.
LATE_REASON: str | None = None


def configure() -> None:
    """Turn on Triton's interpreter on machines with no GPU, unless the user chose already."""
    global LATE_REASON
    if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
        if "triton" in sys.modules:
            LATE_REASON = ("triton was imported before phasebench.kernels could set TRITON_INTERPRET=1; "
                           "set it in the environment or import phasebench.kernels first")
        os.environ["TRITON_INTERPRET"] = "1"


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def mode() -> str:
    """`interpreter` or `compiled`: how Triton rows were produced."""
    return "interpreter" if interpreted() else "compiled"


def compute(device_type: str, dtype: torch.dtype, fields) -> str:
    """What the project's Triton kernels multiply in (an Impl's `compute`): the input dtype when compiled (tl.dot
    on its operands as they come, fp32 without TF32), fp32 in the interpreter (the operands upcast first)."""
    return "float32" if interpreted() else str(dtype).removeprefix("torch.")


def device_types() -> frozenset[str]:
    """Where Triton kernels can take their tensors: the host in the interpreter, CUDA when compiled."""
    return frozenset({"cpu"}) if interpreted() else frozenset({"cuda"})


def why_unavailable(device_type: str) -> str | None:
    """Why the project's Triton kernels cannot take tensors of this device type here, or None."""
    if LATE_REASON:
        return LATE_REASON
    if device_type not in device_types():
        return ("Triton runs in the interpreter on the host here (TRITON_INTERPRET=1)" if interpreted()
                else "compiled Triton needs CUDA tensors")
    return None


FP8_CAPABILITY = (8, 9)  # Triton converts e4m3 (its fp8e4nv) on Ada, Hopper and newer


def fp8_refusal(device: torch.device, instead: str) -> str | None:
    """Why the Triton kernels cannot decode e4m3 bytes (fp8 codes, nvfp4's scales) on `device`, a GPU before sm_89,
    with what runs `instead`; None elsewhere (the interpreter decodes them on the host)."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device) >= FP8_CAPABILITY:
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return f"triton decodes fp8 e4m3 bytes (fp8e4nv) on sm_89 or newer, this GPU is sm_{major}{minor}: {instead}"


def multiprocessor_count(device: torch.device) -> int:
    """Streaming multiprocessors on a CUDA device; host cores stand in for them in the interpreter."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return os.cpu_count() or 1


configure()
