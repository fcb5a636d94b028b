"""Timers: CUDA events with an L2 flush between calls, or perf_counter_ns on the host; warm-up by time."""

from __future__ import annotations

import contextlib
import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ...profiles.names import L2FLUSH
from ...profiles.nvtx_ranges import nvtx_range


@dataclass(frozen=True)
class TimerConfig:
    """How long to warm up and measure one (case, impl), and the bounds on the sample count."""

    warmup_s: float = 0.1
    budget_s: float = 1.0
    min_samples: int = 5
    max_samples: int = 1000
    flush_l2: bool = True
    cuda_graph: bool = False


@dataclass(frozen=True)
class Timing:
    """Latency samples of one call, in milliseconds, summarised by median and the 20th/80th percentiles."""

    samples_ms: tuple[float, ...]
    method: str

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)

    def percentile_ms(self, pct: float) -> float:
        ordered = sorted(self.samples_ms)
        pos = (len(ordered) - 1) * pct / 100
        lo = int(pos)
        hi = min(lo + 1, len(ordered) - 1)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)

    @property
    def count(self) -> int:
        return len(self.samples_ms)


def _sample_count(per_call_s: float, cfg: TimerConfig) -> int:
    wanted = int(cfg.budget_s / max(per_call_s, 1e-7))
    return max(cfg.min_samples, min(cfg.max_samples, wanted))


def _warm_up(fn: Callable[[], object], cfg: TimerConfig, sync: Callable[[], None]) -> float:
    """Run until warm-up time has passed (at least once); return the mean seconds per call."""
    calls, start = 0, time.perf_counter()
    while True:
        fn()
        sync()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= cfg.warmup_s:
            return elapsed / calls


def _samples_range(range_name: str | None, payload):
    """The NVTX range around the sample loop only (none when range_name is None)."""
    return contextlib.nullcontext() if range_name is None else nvtx_range(range_name, payload=payload)


def time_cpu(fn: Callable[[], object], cfg: TimerConfig = TimerConfig(), range_name: str | None = None,
             payload=None) -> Timing:
    """perf_counter_ns around each call after warm-up; range_name: NVTX range around the samples only."""
    per_call = _warm_up(fn, cfg, lambda: None)
    n = _sample_count(per_call, cfg)
    samples = []
    gc_was_on = gc.isenabled()
    gc.disable()  # as timeit does: a collection would land inside a random sample
    try:
        with _samples_range(range_name, payload):
            for _ in range(n):
                t0 = time.perf_counter_ns()
                fn()
                samples.append((time.perf_counter_ns() - t0) / 1e6)
    finally:
        if gc_was_on:
            gc.enable()
    return Timing(tuple(samples), "perf_counter_ns")


def l2_flush_buffer(device: torch.device) -> torch.Tensor:
    """A buffer several times the L2 cache; zeroing it evicts what the previous call left there."""
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 64 << 20
    return torch.empty(max(4 * l2, 256 << 20) // 4, dtype=torch.int32, device=device)


def time_cuda(fn: Callable[[], object], device: torch.device, cfg: TimerConfig = TimerConfig(),
              range_name: str | None = None, payload=None) -> Timing:
    """CUDA events around each call; an L2 flush (outside the events) before each one.

    range_name: NVTX range (with payload) around the samples only, after warm-up and graph capture,
    closed once the last sample has finished on the GPU; each flush sits in a nested 'l2flush' range.
    """
    sync = torch.cuda.synchronize
    per_call = _warm_up(fn, cfg, sync)
    run = fn
    if cfg.cuda_graph:
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            fn()  # allocations of the first call happen outside the capture
            with torch.cuda.graph(graph, stream=stream):
                fn()
        torch.cuda.current_stream(device).wait_stream(stream)
        run = graph.replay
    flush = l2_flush_buffer(device) if cfg.flush_l2 else None
    n = _sample_count(per_call, cfg)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    sync()  # the range opens on an idle GPU: nothing of the warm-up or the capture runs inside it
    with _samples_range(range_name, payload):
        for start, end in zip(starts, ends, strict=True):
            if flush is not None:
                with nvtx_range(L2FLUSH):
                    flush.zero_()
            start.record()
            run()
            end.record()
        sync()
    samples = tuple(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))
    return Timing(samples, "cuda-graph+events" if cfg.cuda_graph else "cuda-events")


def time_call(fn: Callable[[], object], device: torch.device, cfg: TimerConfig = TimerConfig(),
              range_name: str | None = None, payload=None) -> Timing:
    """Time `fn` on the device its tensors live on; range_name (if given) is the NVTX range of the samples."""
    if device.type == "cuda":
        return time_cuda(fn, device, cfg, range_name, payload)
    return time_cpu(fn, cfg, range_name, payload)
