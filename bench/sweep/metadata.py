"""Run metadata written once per run: versions, devices and their properties, git commit, command line."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

from ..instruments.roofline import cpu_model


def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def checkout_commit(root: Path) -> str | None:
    """HEAD of the git checkout holding `root`, with '-dirty' where its tracked files have uncommitted changes (what
    ran is then not that commit) or git cannot tell; None where no checkout answers."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=20)

    try:
        head = git("rev-parse", "HEAD")
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0 or not head.stdout.strip():
        return None
    try:
        status = git("status", "--porcelain", "--untracked-files=no")
        dirty = status.returncode != 0 or bool(status.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        dirty = True  # not provably clean
    return head.stdout.strip() + ("-dirty" if dirty else "")


def git_commit() -> str | None:
    """The commit of the phasebench checkout it runs from (checkout_commit: '-dirty' with uncommitted changes), else
    PHASEBENCH_GIT_COMMIT (set where an installed wheel runs, e.g. from the COMMIT file `phasebench wheels` writes
    beside it), else None."""
    return checkout_commit(Path(__file__).resolve().parent) or os.environ.get("PHASEBENCH_GIT_COMMIT") or None


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
        from ..instruments.memory.host_cache import last_level_cache

        info["name"] = cpu_model()
        info["llc_bytes"], info["llc_source"] = last_level_cache()
    return info


def run_metadata(device: torch.device) -> dict:
    return {
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "triton": _version("triton"),
                     "flash_attn": _version("flash-attn") or _version("flash_attn"),
                     "phasebench": _version("phasebench"), "platform": platform.platform()},
        "device": device_info(device),
        "git_commit": git_commit(),
        "command": list(sys.argv),
        "compile": compile_settings(),
    }


def compile_settings() -> dict:
    """What the compiled impls (flex, compiled) ran under: torch.compile's mode and Inductor's cache location."""
    from ...kernels import inductor

    return {"mode": inductor.compile_mode(), "inductor_cache_dir": inductor.cache_dir(),
            "cache": inductor.cache_kind()}


def _first_line(command: list[str]) -> str | None:
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line.strip() for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    return lines[-1] if out.returncode == 0 and lines else None


def tools() -> dict:
    """The profilers and compilers a GPU session may use, with their versions (None where absent)."""
    from ...profiles.capture import ncu_path, nsys_path

    found = {"nsys": nsys_path(), "ncu": ncu_path(), "nvidia-smi": shutil.which("nvidia-smi"),
             "nvcc": shutil.which("nvcc")}
    return {name: {"path": path, "version": _first_line([path, "--version"]) if path else None}
            for name, path in found.items()}


def flash_attn_status() -> str:
    """The flash_attn version, or why it does not import (then `flash` is SDPA's flash backend)."""
    from ...kernels.attention.flash import flash_attn_module

    module = flash_attn_module()
    if module is not None:
        return f"flash_attn {getattr(module, '__version__', '?')}"
    return "absent: flash impl is PyTorch SDPA's FLASH_ATTENTION backend"


def environment(device: torch.device) -> dict:
    """Everything a run's figures depend on, for `phasebench env` and the self-check: run_metadata, whether CUDA
    and Triton's compiler are here, flash-attn, the tools, and the variables that change what runs."""
    from ...kernels import triton_mode

    return {**run_metadata(device), "cuda_available": torch.cuda.is_available(),
            "cuda_devices": torch.cuda.device_count() if torch.cuda.is_available() else 0,
            "triton_mode": triton_mode.mode(), "flash_attn": flash_attn_status(), "tools": tools(),
            "env": {k: v for k, v in os.environ.items()
                    if k.startswith(("CUDA_", "TRITON_", "PHASEBENCH_", "NVIDIA_", "TORCH_")) or k == "PYTHONPATH"}}


def format_environment(env: dict) -> list[str]:
    """The environment in a few lines."""
    dev, ver = env["device"], env["versions"]
    lines = [f"device: {dev.get('name')} ({dev.get('kind')})"]
    if dev.get("kind") == "cuda":
        memory_gib, l2_mib = (dev.get("memory_bytes") or 0) / 2**30, (dev.get("l2_bytes") or 0) / 2**20
        lines.append(f"  capability {dev.get('capability')}, {dev.get('multiprocessors')} SMs, {memory_gib:.0f} GiB, "
                     f"L2 {l2_mib:.0f} MiB, CUDA {dev.get('cuda')}, driver {dev.get('driver_version')}")
        lines.append(f"  clocks: SM {dev.get('clocks.sm')} of {dev.get('clocks.max.sm')}, "
                     f"memory {dev.get('clocks.mem')} of {dev.get('clocks.max.mem')}, "
                     f"power limit {dev.get('power.limit')}")
    llc = f", last-level cache {dev['llc_bytes'] >> 20} MiB" if dev.get("llc_bytes") else ""
    lines.append(f"host: {dev.get('cpu')}, {dev.get('cpu_count')} cores, {dev.get('torch_threads')} torch threads{llc}")
    lines.append(f"versions: python {ver['python']}, torch {ver['torch']}, triton {ver['triton']} "
                 f"({env['triton_mode']}), phasebench {ver['phasebench']}, git {env.get('git_commit') or 'none'}")
    lines.append(f"flash-attn: {env['flash_attn']}")
    lines.append("tools: " + ", ".join(f"{name} {t['version'] or t['path']}" if t["path"] else f"{name} absent"
                                      for name, t in env["tools"].items()))
    return lines
