"""Timers: CUDA events with an L2 flush between calls, or perf_counter_ns on the host; warm-up by time.

A timer takes one call or several equivalent ones (the same op on copies of its streamed operands, taken in
turn so that none is still cached when it is read again) and an optional `evict` run before each call, outside the
clock. Given a `before_last` or a `guard_last`, after the samples it makes the checked call: one more call in turn,
untimed, whose output it keeps (`Timing.last`) so that the gate judges what the timed loop computes as well as the
first call; `before_last` runs before it (it poisons what an in-place op must rewrite) and `guard_last` around it
(the measuring path poisons its fresh allocations there, so that its torch.empty cannot find the previous call's
right answer; a poisoned call is not a sample: the poison's fill would lengthen it).
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

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
    cold: bool = False  # host: the operands a forward pass streams are timed cold (bench.instruments.cold)


@dataclass(frozen=True)
class Timing:
    """Latency samples of one call, in milliseconds, summarised by median and the 20th/80th percentiles."""

    samples_ms: tuple[float, ...]
    method: str
    last: object = field(default=None, compare=False, repr=False)  # the checked call's output (None: not asked)

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


def _calls(fn: Callable[[], object] | Sequence[Callable[[], object]]) -> list[Callable[[], object]]:
    calls = [fn] if callable(fn) else list(fn)
    if not calls:
        raise ValueError("calls: need at least one call to time")
    return calls


def _warm_up(calls, cfg: TimerConfig, sync: Callable[[], None],
             evict: Callable[[], None] | None = None) -> tuple[float, int]:
    """Run the calls in turn until warm-up time has passed (at least once); return the mean wall seconds per call,
    its eviction included (so that the sample count keeps the sampling near its budget), and how many calls ran
    (the samples go on from the next one in turn, so the first sample never rereads what warm-up just read)."""
    n, start = 0, time.perf_counter()
    while True:
        if evict is not None:
            evict()
        calls[n % len(calls)]()
        sync()
        n += 1
        elapsed = time.perf_counter() - start
        if elapsed >= cfg.warmup_s:
            return elapsed / n, n


def _samples_range(range_name: str | None, payload):
    """The NVTX range around the sample loop only (none when range_name is None)."""
    return contextlib.nullcontext() if range_name is None else nvtx_range(range_name, payload=payload)


Guard = Callable[[], contextlib.AbstractContextManager]


def checked_call(call: Callable[[], object], sync: Callable[[], None], before_last: Callable[[], None] | None = None,
                 guard_last: Guard | None = None) -> object:
    """The call after the samples whose output the gate judges: `before_last` first, then the call under
    `guard_last`, completed on the device; untimed. None, without a call, when neither is given (nothing checks)."""
    if before_last is None and guard_last is None:
        return None
    if before_last is not None:
        before_last()
    with guard_last() if guard_last is not None else contextlib.nullcontext():
        out = call()
        sync()
    return out


def time_cpu(fn: Callable[[], object] | Sequence[Callable[[], object]], cfg: TimerConfig = TimerConfig(),
             range_name: str | None = None, payload=None, evict: Callable[[], None] | None = None,
             before_last: Callable[[], None] | None = None, guard_last: Guard | None = None) -> Timing:
    """perf_counter_ns around each call after warm-up, the calls taken in turn, `evict` run before each one (outside
    the clock), then the checked call (the next in turn); range_name: NVTX range around the samples only."""
    calls = _calls(fn)
    per_call, offset = _warm_up(calls, cfg, lambda: None, evict)
    n = _sample_count(per_call, cfg)
    samples = []
    gc_was_on = gc.isenabled()
    gc.disable()  # as timeit does: a collection would land inside a random sample
    try:
        with _samples_range(range_name, payload):
            for i in range(n):
                call = calls[(offset + i) % len(calls)]
                if evict is not None:
                    evict()
                t0 = time.perf_counter_ns()
                call()
                samples.append((time.perf_counter_ns() - t0) / 1e6)
    finally:
        if gc_was_on:
            gc.enable()
    last = checked_call(calls[(offset + n) % len(calls)], lambda: None, before_last, guard_last)
    return Timing(tuple(samples), "perf_counter_ns", last)


def l2_flush_buffer(device: torch.device) -> torch.Tensor:
    """A buffer several times the L2 cache; zeroing it evicts what the previous call left there."""
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 64 << 20
    return torch.empty(max(4 * l2, 256 << 20) // 4, dtype=torch.int32, device=device)


def time_cuda(fn: Callable[[], object] | Sequence[Callable[[], object]], device: torch.device,
              cfg: TimerConfig = TimerConfig(), range_name: str | None = None, payload=None,
              stream: torch.cuda.Stream | None = None, before_last: Callable[[], None] | None = None,
              guard_last: Guard | None = None) -> Timing:
    """CUDA events around each call; an L2 flush (outside the events) before each one.

    range_name: NVTX range (with payload) around the samples only, after warm-up and graph capture,
    closed once the last sample has finished on the GPU; each flush sits in a nested 'l2flush' range.
    With several calls each is taken in turn (each captured in a graph of its own with cuda_graph); the output kept
    is the checked call's, the next in turn after the samples (with cuda_graph, the graph's output after one more
    replay: a replay allocates nothing, it reruns the captured kernels into the graph's own output).
    stream: run, record and wait on that stream only (a call timed beside work on other streams); by default the
    current stream, and waits synchronise the whole device.
    before_last, guard_last: run before and around the checked call (enqueued work outside the events).
    """
    if stream is not None:
        with torch.cuda.stream(stream):
            return _time_cuda(fn, device, cfg, range_name, payload, stream.synchronize, before_last, guard_last)
    return _time_cuda(fn, device, cfg, range_name, payload, torch.cuda.synchronize, before_last, guard_last)


def _time_cuda(fn, device: torch.device, cfg: TimerConfig, range_name: str | None, payload,
               sync: Callable[[], None], before_last: Callable[[], None] | None = None,
               guard_last: Guard | None = None) -> Timing:
    calls = _calls(fn)
    per_call, _ = _warm_up(calls, cfg, sync)
    runs, static = calls, [None] * len(calls)
    if cfg.cuda_graph:
        runs = []
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for i, call in enumerate(calls):
                graph = torch.cuda.CUDAGraph()
                call()  # allocations of the first call happen outside the capture
                with torch.cuda.graph(graph, stream=stream):
                    static[i] = call()  # replays rewrite this output in place
                runs.append(graph.replay)
        torch.cuda.current_stream(device).wait_stream(stream)
    flush = l2_flush_buffer(device) if cfg.flush_l2 else None
    n = _sample_count(per_call, cfg)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    sync()  # the range opens on an idle GPU: nothing of the warm-up or the capture runs inside it
    with _samples_range(range_name, payload):
        for i, (start, end) in enumerate(zip(starts, ends, strict=True)):
            if flush is not None:
                with nvtx_range(L2FLUSH):
                    flush.zero_()
            start.record()
            runs[i % len(runs)]()
            end.record()
        sync()
    samples = tuple(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))
    last = checked_call(runs[n % len(runs)], sync, before_last, guard_last)
    if cfg.cuda_graph and (before_last is not None or guard_last is not None):
        last = static[n % len(runs)]
    return Timing(samples, "cuda-graph+events" if cfg.cuda_graph else "cuda-events", last)


def time_call(fn: Callable[[], object] | Sequence[Callable[[], object]], device: torch.device,
              cfg: TimerConfig = TimerConfig(), range_name: str | None = None, payload=None,
              evict: Callable[[], None] | None = None, stream=None,
              before_last: Callable[[], None] | None = None, guard_last: Guard | None = None) -> Timing:
    """Time `fn` (or several equivalent calls in turn) on the device its tensors live on; range_name (if given) is
    the NVTX range of the samples; `evict` runs before each host call, outside the clock (a GPU flushes L2);
    `before_last` and `guard_last` before and around the checked call after the samples (its output is kept);
    `stream`: a CUDA stream to time on alone (see time_cuda)."""
    if device.type == "cuda":
        return time_cuda(fn, device, cfg, range_name, payload, stream, before_last, guard_last)
    return time_cpu(fn, cfg, range_name, payload, evict, before_last, guard_last)
