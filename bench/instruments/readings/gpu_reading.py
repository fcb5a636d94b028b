"""One reading of a GPU for the contention probe: SM clock, its maximum, throttle reasons, other compute processes."""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass

import torch

from ..conditions import smi

SMI_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class GpuReading:
    """SM clock, its maximum, the active throttle reasons and the other compute processes on one GPU."""

    sm_mhz: float | None = None
    max_sm_mhz: float | None = None
    throttle: int | None = None
    other_pids: tuple[int, ...] | None = None
    source: str = ""
    at_s: float = 0.0


def nvml_index(device: torch.device) -> int:
    """The NVML / nvidia-smi index of a torch CUDA device (CUDA_VISIBLE_DEVICES renumbers them)."""
    try:
        return int(torch.cuda._get_nvml_device_index(device))
    except Exception:  # a private helper: fall back to torch's numbering
        return device.index or 0


def _others(pids: list[int]) -> tuple[int, ...]:
    me = os.getpid()
    if me in pids:
        return tuple(p for p in pids if p != me)
    # in a container nvidia-smi may list host PIDs: then one of them is this process
    if pids and torch.cuda.is_initialized():
        return tuple(sorted(pids)[1:])
    return tuple(pids)


@functools.cache
def _nvml():
    """pynvml, initialised once per process; None where it is missing or finds no driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:
        return None


def _nvml_reading(index: int) -> GpuReading | None:
    pynvml = _nvml()
    if pynvml is None:
        return None
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) \
            or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        pids = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
        return GpuReading(sm_mhz=pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                          max_sm_mhz=pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
                          throttle=int(reasons(handle)), other_pids=_others(pids), source="nvml",
                          at_s=time.perf_counter())
    except Exception:  # no pynvml, no driver, or a field this GPU does not report
        return None


def _number(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None  # "[N/A]" and the like


def parse_smi_gpu(text: str) -> tuple[float | None, float | None, int | None]:
    """`clocks.sm,clocks.max.sm,clocks_throttle_reasons.active` as csv,noheader,nounits."""
    parts = [p.strip() for p in text.strip().splitlines()[0].split(",")] if text.strip() else []
    if len(parts) != 3:
        return None, None, None
    try:
        throttle = int(parts[2], 16)
    except ValueError:
        throttle = None
    return _number(parts[0]), _number(parts[1]), throttle


def parse_smi_pids(text: str) -> list[int]:
    return [int(line.strip()) for line in text.splitlines() if line.strip().isdigit()]


def _smi_reading(index: int) -> GpuReading | None:
    gpu = None
    for reasons in ("clocks_event_reasons.active", "clocks_throttle_reasons.active"):  # newer name first
        gpu = smi([f"--query-gpu=clocks.sm,clocks.max.sm,{reasons}", "--format=csv,noheader,nounits",
                    "-i", str(index)], timeout=SMI_TIMEOUT_S)
        if gpu is not None:
            break
    if gpu is None:
        return None
    apps = smi(["--query-compute-apps=pid", "--format=csv,noheader", "-i", str(index)], timeout=SMI_TIMEOUT_S)
    sm, max_sm, throttle = parse_smi_gpu(gpu)
    return GpuReading(sm_mhz=sm, max_sm_mhz=max_sm, throttle=throttle,
                      other_pids=None if apps is None else _others(parse_smi_pids(apps)), source="nvidia-smi",
                      at_s=time.perf_counter())


def read_gpu(device: torch.device) -> GpuReading | None:
    """A reading of a CUDA device through pynvml, else nvidia-smi; None where neither answers."""
    if device.type != "cuda":
        return None
    index = nvml_index(device)
    return _nvml_reading(index) or _smi_reading(index)
