"""Contention while a case is timed: other work on the host's CPUs or on the GPU flags the row as noisy."""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from .conditions import gpu_state, host_state
from .memory.host_cache import allowed_cpus
from .readings.gpu_reading import GpuReading, read_gpu
from .readings.host_reading import HostReading, memory_cpus, process_cpu_s, read_host, running_others

__all__ = ["ContentionProbe", "HostReading", "Watch", "judge_gpu", "judge_host", "process_cpu_s", "read_host",
           "snapshot", "summary_warning", "without_companions"]

# Our threads waiting in a run queue (schedstat, ns resolution) is the direct sign that something else had
# the CPU they were ready to use. Quiet windows on a 2-core host read 0.00-0.02 s per s; one busy process
# reads ~0.6-1.3 s per s. 0.2 sits between them.
WAIT_LIMIT = 0.2
# CPU used by other processes, in cores, counted against the tick-rounding margin below. 0.25 of a core
# is well above what idle daemons use (quiet reads ~0.0-0.05) and below one busy process (~0.6-1.3).
OTHER_CORES_LIMIT = 0.25
# /proc/stat counts in ticks (1/HZ s): each CPU's figure is off by up to a tick at each end of a window, and
# our own ticks are sampled while process_time() is exact, so a window's "other" figure gets this many
# ticks per CPU of slack before it may count.
TICK_SLACK = 2
# Where schedstat is unreadable, the CPUs count as saturated when our use plus others' is this close to all.
SATURATION_SLACK = 0.5
# NVML throttle bits that slow a kernel for reasons outside it: HW slowdown, SW thermal, HW thermal and HW
# power brake. Idle, application clocks and the SW power cap are left out: a kernel that draws the board to
# its power limit is measured as the hardware runs it.
THROTTLE_NAMES = {0x8: "hw slowdown", 0x20: "sw thermal", 0x40: "hw thermal", 0x80: "power brake"}
THROTTLE_FLAGGED = sum(THROTTLE_NAMES)
# nvidia-smi takes ~50-100 ms, so a reading this fresh (the previous case's "after") serves as "before".
SMI_REUSE_S = 10.0

HOST_CAUSE, GPU_SHARED_CAUSE, GPU_THROTTLE_CAUSE = "busy host", "shared GPU", "GPU throttled"
PROBE_CAUSE = "contention unknown"  # the probe itself failed: the row cannot be called quiet


# ---- decisions -------------------------------------------------------------------------------------


def judge_host(before: HostReading, after: HostReading, hz: int | None = None,
               shares_memory: bool = False) -> tuple[str, dict]:
    """The host reason (empty when quiet) and the figures of the window between two readings.

    shares_memory: the device measured is the host itself, so other processes busy on its other cores slow a
    case through the shared caches and memory bandwidth even when our threads never wait for a CPU (a
    single-threaded case, Triton's interpreter): their CPU share alone flags the window.
    With companions (co-runners started on purpose), their CPU time counts as ours and our threads' waiting is
    their doing: only the CPU that other processes used flags the window."""
    hz = hz or os.sysconf("SC_CLK_TCK")
    wall = max(after.wall_s - before.wall_s, 1e-9)
    companion = max(0.0, after.companion_cpu_s - before.companion_cpu_s)
    own = after.own_cpu_s - before.own_cpu_s + companion
    stats: dict = {"window_s": round(wall, 4), "cpus": after.cpus, "own_cores": round(own / wall, 3)}
    if after.companions:
        stats["companion_cores"] = round(companion / wall, 3)
    other_cores = other_low = None
    if before.busy_ticks is not None and after.busy_ticks is not None:
        other = max(0.0, (after.busy_ticks - before.busy_ticks) / hz - own)
        other_cores = other / wall
        other_low = max(0.0, other - TICK_SLACK * after.cpus / hz) / wall
        stats.update(other_cores=round(other_cores, 3), other_cores_low=round(other_low, 3),
                     steal_cores=round((after.steal_ticks - before.steal_ticks) / hz / wall, 3))
    wait = None
    if before.wait_s is not None and after.wait_s is not None:
        wait = max(0.0, after.wait_s - before.wait_s) / wall
        stats["wait_cores"] = round(wait, 3)
    runnable = [r.procs_running - r.own_running for r in (before, after)
                if r.procs_running is not None and r.own_running is not None]
    if runnable:
        stats["others_runnable"] = max(runnable)
    others_busy = other_low is not None and other_low >= OTHER_CORES_LIMIT
    if after.companions:
        contended = others_busy
    elif wait is not None:
        contended = wait >= WAIT_LIMIT or (shares_memory and others_busy)
    elif other_cores is not None:  # no schedstat: others were busy and the CPUs had no room left (or share memory)
        contended = others_busy and (shares_memory or own / wall + other_cores >= after.cpus - SATURATION_SLACK)
    else:  # neither source: other runnable tasks at both ends of the window
        contended = len(runnable) == 2 and min(runnable) >= 1
    if not contended:
        return "", stats
    parts = []
    if others_busy:
        steal = stats["steal_cores"]
        stolen = f" ({steal:.2f} of it taken by the hypervisor)" if steal >= other_cores / 2 else ""
        parts.append(f"other processes used {other_cores:.2f} of {after.cpus} CPUs while sampling{stolen}")
    if wait is not None and wait >= WAIT_LIMIT and not after.companions:
        parts.append(f"our threads waited {wait:.2f} s per s for a CPU")
    elif others_busy and shares_memory:
        parts.append("sharing the caches and memory bandwidth")
    if not parts:
        parts.append(f"{max(runnable)} other tasks were runnable")
    if not others_busy and after.torch_threads > after.cpus:
        parts.append(f"torch uses {after.torch_threads} threads on {after.cpus} CPUs")
    return f"{HOST_CAUSE}: " + ", ".join(parts), stats


def without_companions(pids: tuple[int, ...], companions: tuple[int, ...]) -> tuple[int, ...]:
    """Other compute processes less our co-runners: by pid, or where none of them is listed (nvidia-smi in a
    container may list host pids), as many of the highest pids as there are co-runners (they started after us)."""
    if not companions:
        return tuple(pids)
    listed = [p for p in pids if p not in companions]
    if len(listed) < len(pids):
        return tuple(listed)
    return tuple(sorted(pids)[:max(0, len(pids) - len(companions))])


def judge_gpu(before: GpuReading | None, after: GpuReading | None,
              companions: tuple[int, ...] = ()) -> tuple[list[str], dict]:
    """GPU reasons (other compute processes, throttling) and the figures, from readings around a window; the
    co-runner processes in `companions` are not others."""
    stats: dict = {}
    reasons: list[str] = []
    readings = [r for r in (before, after) if r is not None]
    if not readings:
        return reasons, stats
    last = readings[-1]
    stats.update(gpu_source=last.source, sm_mhz=last.sm_mhz, max_sm_mhz=last.max_sm_mhz)
    pids = sorted({p for r in readings if r.other_pids for p in without_companions(r.other_pids, companions)})
    stats["gpu_other_pids"] = pids
    if pids:
        shown = ", ".join(map(str, pids[:4])) + (" ..." if len(pids) > 4 else "")
        reasons.append(f"{GPU_SHARED_CAUSE}: {len(pids)} other compute processes on the GPU (pid {shown})")
    mask = 0
    for r in readings:
        mask |= r.throttle or 0
    stats["throttle"] = hex(mask)
    if mask & THROTTLE_FLAGGED:
        names = ", ".join(n for bit, n in THROTTLE_NAMES.items() if mask & bit)
        clock = f" (SM {last.sm_mhz:.0f} of {last.max_sm_mhz:.0f} MHz)" if last.sm_mhz and last.max_sm_mhz else ""
        reasons.append(f"{GPU_THROTTLE_CAUSE}: {names}{clock}")
    return reasons, stats


# ---- the probe -------------------------------------------------------------------------------------


@dataclass
class Watch:
    """The verdict on one timed window; filled when the `with` block ends."""

    noisy: bool = False
    reason: str = ""
    stats: dict = field(default_factory=dict)


class ContentionProbe:
    """Watches each case's sampling window on the host, and on the GPU for a CUDA device. Never raises: a probe that
    fails marks its window noisy, with the error as the reason."""

    def __init__(self, device: torch.device | str, cpus: set[int] | None = None):
        self.device = torch.device(device)
        # the CPUs to watch: given, or for the host as the device every CPU that shares its memory (the whole
        # machine where that is unknown: a neighbour on another core takes bandwidth from a pinned case), else
        # those the calling thread may run on at each reading
        self.whole = False
        if cpus is None and self.device.type == "cpu":
            cpus = memory_cpus()
            self.whole = cpus is None
        self.cpus = cpus
        self._last_gpu: GpuReading | None = None
        self._gpu_readable = self.device.type == "cuda"  # cleared after the first reading that finds nothing

    def _gpu(self, fresh_only: bool) -> GpuReading | None:
        last = self._last_gpu
        if (not fresh_only and last is not None and last.source == "nvidia-smi"
                and time.perf_counter() - last.at_s < SMI_REUSE_S):
            return last
        if not self._gpu_readable:
            return None
        try:
            self._last_gpu = read_gpu(self.device)
        except Exception:
            self._last_gpu = None
        self._gpu_readable = self._last_gpu is not None
        return self._last_gpu

    @contextlib.contextmanager
    def watch(self, companions: tuple[int, ...] = ()) -> Iterator[Watch]:
        """The verdict on the block; `companions`: pids of co-runners started on purpose, whose use of the CPUs
        and the GPU is not contention."""
        result = Watch()
        try:
            gpu_before = self._gpu(fresh_only=False)
            before = read_host(self.cpus, companions, self.whole)
        except Exception as err:  # a probe failure must not fail the case it watches, nor call it quiet
            before = _failed(result, err)
        try:
            yield result
        finally:
            if before is not None:
                try:
                    after = read_host(self.cpus, companions, self.whole)  # time_call has synchronised the device
                    self._judge(result, before, after, gpu_before, self._gpu(fresh_only=True), companions)
                except Exception as err:
                    _failed(result, err)

    def _judge(self, result: Watch, before: HostReading, after: HostReading,
               gpu_before: GpuReading | None, gpu_after: GpuReading | None, companions: tuple[int, ...] = ()) -> None:
        host_reason, stats = judge_host(before, after, shares_memory=self.device.type == "cpu")
        gpu_reasons, gpu_stats = judge_gpu(gpu_before, gpu_after, companions)
        if host_reason:
            names = running_others(exclude=companions)
            if names:
                host_reason += f" (running: {', '.join(names)})"
        reasons = [host_reason] * bool(host_reason) + gpu_reasons
        result.noisy, result.reason, result.stats = bool(reasons), "; ".join(reasons), {**stats, **gpu_stats}


def _failed(result: Watch, err: Exception) -> None:
    """A window whose probe raised: noisy, the error its reason (nothing says the device was quiet)."""
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    result.noisy, result.reason = True, f"{PROBE_CAUSE}: the contention probe failed ({type(err).__name__}: {text})"
    result.stats["probe_error"] = text


# ---- run snapshots and the end-of-run line ---------------------------------------------------------


def snapshot(device: torch.device | str) -> dict:
    """Host and device state for run.json, taken before and after a run. Never raises."""
    out: dict = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    def host():
        return {**host_state(), "cpus_allowed": len(allowed_cpus()), "torch_threads": torch.get_num_threads(),
                "running_others": running_others(limit=5)}

    for key, fn in (("host", host), ("gpu", lambda: gpu_state(torch.device(device)))):
        try:
            out[key] = fn()
        except Exception as err:
            out[key] = {"error": str(err).splitlines()[0] if str(err) else type(err).__name__}
    return out


def _records(rows) -> list[dict]:
    return rows.to_dict("records") if hasattr(rows, "to_dict") else list(rows)


def summary_warning(rows) -> str | None:
    """One line on how many rows were timed under contention, the likely cause and what to do; None if none.

    `rows`: dicts or a DataFrame with `noisy` and `noise_reason`; a row whose `noisy` is None or NaN was not timed.
    """
    records = _records(rows)
    flags = [r.get("noisy") for r in records]
    timed = [f for f in flags if isinstance(f, bool) or f in (0, 1)]  # NaN / None: the row was not timed
    noisy = [r for r in records if r.get("noisy") is True or r.get("noisy") == 1]
    if not noisy:
        return None
    reasons = [str(r.get("noise_reason") or "cause unknown") for r in noisy]
    causes = Counter(reason.split(":")[0] for reason in reasons)
    cause, _ = causes.most_common(1)[0]
    example = next(reason for reason in reasons if reason.split(":")[0] == cause).split(": ", 1)[-1].split(";")[0]
    named = ", ".join(c for c, _ in causes.most_common())
    return (f"{len(noisy)} of {len(timed)} timed rows were noisy ({named}), e.g. {example}. "
            "Their latencies are inflated: stop the other work and re-run those cases.")
