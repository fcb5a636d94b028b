"""Run metadata written once per run: versions, devices and their properties, git commit, command line."""

from __future__ import annotations

import platform
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

from .roofline import cpu_model


def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def git_commit() -> str | None:
    """The commit of the phasebench checkout, when it runs from one."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def _nvidia_smi() -> dict:
    """Driver and clocks where nvidia-smi answers; empty elsewhere."""
    fields = "driver_version,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.limit"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return {}
    if out.returncode != 0 or not out.stdout.strip():
        return {}
    values = [v.strip() for v in out.stdout.splitlines()[0].split(",")]
    return dict(zip(fields.split(","), values, strict=False))


def device_info(device: torch.device) -> dict:
    info = {"kind": device.type, "cpu": cpu_model(), "cpu_count": __import__("os").cpu_count(),
            "torch_threads": torch.get_num_threads()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(name=props.name, index=device.index or 0, capability=f"{props.major}.{props.minor}",
                    multiprocessors=props.multi_processor_count, memory_bytes=props.total_memory,
                    l2_bytes=getattr(props, "L2_cache_size", None), cuda=torch.version.cuda, **_nvidia_smi())
    else:
        info["name"] = cpu_model()
    return info


def run_metadata(device: torch.device) -> dict:
    return {
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "triton": _version("triton"),
                     "flash_attn": _version("flash-attn") or _version("flash_attn"),
                     "phasebench": _version("phasebench"), "platform": platform.platform()},
        "device": device_info(device),
        "git_commit": git_commit(),
        "command": list(sys.argv),
    }
