"""The state of the host and the GPU around a measurement (load, clocks, throttling, other processes), best effort."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator

import torch

# NVML clock event (throttle) reason bits, as nvidia-smi prints them in clocks_event_reasons.active.
THROTTLE_BITS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
                 0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
                 0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting"}
# nvidia-smi --query-gpu field -> gpu_state key, and how to read it.
GPU_FIELDS = {"driver_version": ("driver", str), "clocks.sm": ("sm_clock_mhz", int),
              "clocks.max.sm": ("sm_clock_max_mhz", int), "clocks.mem": ("mem_clock_mhz", int),
              "clocks.max.mem": ("mem_clock_max_mhz", int), "power.draw": ("power_w", float),
              "power.limit": ("power_limit_w", float), "temperature.gpu": ("temperature_c", int),
              "utilization.gpu": ("utilization_pct", int)}
REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")  # newer name first
# Keys that do not change during a measurement: `watch` keeps one value, not a before/after pair.
STATIC_KEYS = {"driver", "sm_clock_max_mhz", "mem_clock_max_mhz", "power_limit_w", "cpu_count"}
RAW_HOST_KEYS = {"cpu_busy_s", "cpu_total_s", "self_cpu_s"}
OTHERS_CPU_SHARE_LIMIT = 0.25


def host_state() -> dict:
    """A snapshot of the host, {} for what cannot be read (never raises).

    Keys: `load_1m` (1-minute load average), `running` (runnable tasks now, this process's threads
    included) and `processes` (all tasks), from /proc/loadavg; `cpu_count`; `cpu_busy_s` and
    `cpu_total_s` (CPU seconds since boot, all CPUs, busy and in all, from /proc/stat: the whole
    host, also outside a container's CPU limit) and `self_cpu_s` (this process's CPU seconds, all
    threads). The last three are counters: compare two snapshots with `others_cpu_share`.
    """
    state: dict = {"self_cpu_s": time.process_time()}
    with contextlib.suppress(Exception):
        state["cpu_count"] = os.cpu_count()
    with contextlib.suppress(Exception):
        fields = open("/proc/loadavg").read().split()
        running, processes = fields[3].split("/")
        state.update(load_1m=float(fields[0]), running=int(running), processes=int(processes))
    with contextlib.suppress(Exception):
        line = open("/proc/stat").readline().split()
        if line[0] == "cpu":
            # user nice system idle iowait irq softirq steal (guest time is already counted in user)
            ticks = [int(v) for v in line[1:9]]
            hz = os.sysconf("SC_CLK_TCK")
            state["cpu_total_s"] = sum(ticks) / hz
            state["cpu_busy_s"] = (sum(ticks) - ticks[3] - ticks[4]) / hz
    return state


def others_cpu_share(before: dict, after: dict) -> float | None:
    """Share (0..1) of all the host's CPU time between two `host_state`s used by other processes."""
    try:
        total = after["cpu_total_s"] - before["cpu_total_s"]
        others = (after["cpu_busy_s"] - before["cpu_busy_s"]) - (after["self_cpu_s"] - before["self_cpu_s"])
    except (KeyError, TypeError):
        return None
    if total <= 0:
        return None
    return round(min(1.0, max(0.0, others / total)), 3)


def smi(args: list[str], timeout: float = 10) -> str | None:
    """stdout of `nvidia-smi ARGS` ("" when it has nothing to list), None where it is missing or fails."""
    try:
        out = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=timeout,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def _smi_id(device: torch.device) -> str | None:
    """The id nvidia-smi knows `device` by: its UUID, else the index CUDA_VISIBLE_DEVICES maps it to."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    with contextlib.suppress(Exception):
        uuid = str(torch.cuda.get_device_properties(index).uuid)
        if uuid:
            return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return str(index)
    entries = [v.strip() for v in visible.split(",") if v.strip()]
    return entries[index] if index < len(entries) else None


def driver_version(device: torch.device) -> str | None:
    """The GPU driver's version from nvidia-smi, else the CUDA version the driver supports, else None."""
    if device.type != "cuda":
        return None
    with contextlib.suppress(Exception):
        smi_id = _smi_id(device)
        out = smi([f"--id={smi_id}", "--query-gpu=driver_version", "--format=csv,noheader"]) if smi_id else None
        if out and out.strip():
            return out.splitlines()[0].strip()
        return f"cuda {torch._C._cuda_getDriverVersion()}"  # no public torch API for it
    return None


def _value(text: str, kind):
    text = text.strip()
    if not text or text.startswith("[") or text.lower() in ("n/a", "not supported"):
        return None
    try:
        return kind(float(text)) if kind is int else kind(text)
    except ValueError:
        return None


def _throttle_reasons(mask: str) -> list[str] | None:
    try:
        bits = int(mask.strip(), 16)
    except ValueError:
        return None
    names = [name for bit, name in THROTTLE_BITS.items() if bits & bit]
    return names + ([f"other_0x{bits & ~sum(THROTTLE_BITS):x}"] if bits & ~sum(THROTTLE_BITS) else [])


def gpu_state(device: torch.device) -> dict:
    """A snapshot of one CUDA device from nvidia-smi, {} for what cannot be read (never raises).

    Keys: `driver` (driver version), `sm_clock_mhz`, `sm_clock_max_mhz`, `mem_clock_mhz`,
    `mem_clock_max_mhz`, `power_w`, `power_limit_w`, `temperature_c`, `utilization_pct`,
    `throttle` (names of the active clock event reasons, e.g. ["gpu_idle"] or ["sw_power_cap"]) and
    `other_pids` (compute processes on this GPU other than this one; in a container with its own
    PID namespace nvidia-smi may list none, or list this process under its host pid).
    """
    try:
        return _gpu_state(device)
    except Exception:  # a broken driver stack must never stop a benchmark
        return {}


def _gpu_state(device: torch.device) -> dict:
    if device.type != "cuda":
        return {}
    smi_id = _smi_id(device)
    if smi_id is None:
        return {}
    fields = list(GPU_FIELDS)
    state: dict = {}
    for query in ([*fields, REASON_FIELDS[0]], [*fields, REASON_FIELDS[1]], fields):
        out = smi([f"--id={smi_id}", f"--query-gpu={','.join(query)}", "--format=csv,noheader,nounits"])
        if not out or not out.strip():
            continue
        values = out.splitlines()[0].split(",")
        for name, text in zip(query, values, strict=False):
            if name in GPU_FIELDS:
                key, kind = GPU_FIELDS[name]
                value = _value(text, kind)
            else:
                key, value = "throttle", _throttle_reasons(text)
            if value is not None:
                state[key] = value
        break
    if not state:
        return {}
    apps = smi([f"--id={smi_id}", "--query-compute-apps=pid", "--format=csv,noheader,nounits"])
    if apps is not None:
        pids = {_value(line, int) for line in apps.splitlines()}
        state["other_pids"] = sorted(p for p in pids if p is not None and p != os.getpid())
    return state


def merge(before: dict, after: dict) -> dict:
    """One dict from two snapshots: static keys once, lists as their union, numbers as [before, after]."""
    merged: dict = {}
    for key in [*before, *(k for k in after if k not in before)]:
        b, a = before.get(key), after.get(key)
        if key in STATIC_KEYS:
            merged[key] = a if a is not None else b
        elif isinstance(b, list) or isinstance(a, list):
            merged[key] = sorted(set(b or []) | set(a or []))
        else:
            merged[key] = [b, a]
    return merged


def _without_counters(state: dict) -> dict:
    return {k: v for k, v in state.items() if k not in RAW_HOST_KEYS}


@contextlib.contextmanager
def watch(device: torch.device) -> Iterator[dict]:
    """Record the conditions of the block into the yielded dict when it ends.

    Keys: those of `host_state` (less its counters) and, on CUDA, of `gpu_state`, merged by `merge`,
    plus `others_cpu_share` (see `others_cpu_share`) where /proc/stat can be read.
    """
    record: dict = {}
    gpu_before = gpu_state(device) if device.type == "cuda" else {}
    host_before = host_state()  # after nvidia-smi, whose own CPU time must not count as others'
    yield record
    host_after = host_state()
    gpu_after = gpu_state(device) if device.type == "cuda" else {}
    record.update(merge(_without_counters(host_before), _without_counters(host_after)))
    share = others_cpu_share(host_before, host_after)
    if share is not None:
        record["others_cpu_share"] = share
    record.update(merge(gpu_before, gpu_after))


def load_warnings(conditions: dict, what: str = "ceilings") -> list[str]:
    """One line per sign that `what` was measured on a busy machine: CPU used by others, GPU throttled or shared."""
    warnings = []
    share = conditions.get("others_cpu_share")
    if isinstance(share, (int, float)) and share > OTHERS_CPU_SHARE_LIMIT:
        warnings.append(f"{what} measured under load: other processes used {share:.0%} of the host CPU")
    throttle = [r for r in conditions.get("throttle") or [] if r != "gpu_idle"]
    if throttle:
        warnings.append(f"{what} measured with GPU clock throttle reasons active: {', '.join(throttle)}")
    pids = conditions.get("other_pids") or []
    if pids:
        warnings.append(f"{what} measured with {len(pids)} other compute process(es) on the GPU: "
                        f"pids {', '.join(map(str, pids))}")
    return warnings


def describe(conditions: dict) -> str:
    """The conditions in one line, `key=value` with before->after pairs and shares in percent."""
    parts = []
    for key, value in conditions.items():
        if isinstance(value, list) and len(value) == 2 and key not in ("throttle", "other_pids"):
            value = "->".join("?" if v is None else f"{v:g}" if isinstance(v, float) else str(v) for v in value)
        elif isinstance(value, list):
            value = ",".join(map(str, value)) or "none"
        elif key == "others_cpu_share":
            value = f"{value:.0%}"
        parts.append(f"{key}={value}")
    return " ".join(parts) or "unknown"
