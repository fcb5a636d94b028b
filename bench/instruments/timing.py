"""Timers: CUDA events with an L2 flush between calls, or perf_counter_ns on the host; warm-up until the timings are
steady; samples taken in batches until the median's confidence interval is narrow enough and the halves of the samples
agree, or a limit passes.

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
import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import torch

from ...profiles.nvtx_ranges import nvtx_range
from ..spec.interval import (
    FIXED_COUNT,
    SAMPLE_LIMIT,
    TARGET,
    TIME_LIMIT,
    MedianInterval,
    half_intervals,
    interval_columns,
    median_interval,
    medians_agree,
    outlier_count,
    percentile,
    stop_reason_of,
)
from .cuda_events import EventBatches, l2_flush_buffer
from .memory.poison import scrub, storages

# The relative half-width of the 95% interval of the median at which the runner stops sampling, per device kind: a
# GPU's events resolve a microsecond and repeat closely; the host's clock sees the scheduler and its neighbours.
CI_TARGETS = {"cuda": 0.01, "cpu": 0.02}
WARMUP_WINDOWS = 3  # windows in the minimum warm-up; each look compares the latest with the one two before
WINDOW_CALLS = 6  # the fewest calls in a warm-up window: the fewest whose median has a 95% interval


@dataclass(frozen=True)
class TimerConfig:
    """How long to warm up and measure one (case, impl), and the bounds on the sample count.

    The warm-up runs at least `warmup_s` (and `warmup_calls`), then on until its timings are steady, to `max_warmup_s`
    at most (_warm_up). With a `target`, samples come in batches until the relative half-width of the median's 95%
    interval is at most `target` and the intervals of the medians of the samples' two halves overlap (after
    `min_samples` and `min_time_s`), or until `budget_s` of sampling (the time limit) or `max_samples`; without one,
    the count is set once from the warm-up to fill `budget_s`."""

    warmup_s: float = 0.1  # the minimum warm-up, WARMUP_WINDOWS windows
    budget_s: float = 1.0
    min_samples: int = 5
    max_samples: int = 1000
    flush_l2: bool = True
    cuda_graph: bool = False
    cold: bool = False  # host: the operands a forward pass streams are timed cold (bench.instruments.cold)
    target: float = 0.0  # relative half-width of the median's 95% interval that stops sampling (0: no target)
    min_time_s: float = 0.0  # seconds of sampling before the target may stop it
    warmup_calls: int = 1  # calls the warm-up makes at least (0 with warmup_s 0: none, the gate's call warmed it)
    max_warmup_s: float = 0.0  # the warm-up's cap while its timings are not steady (at most warmup_s, or a warmup_s
    # of 0: a fixed warm-up, which does not look)


@dataclass(frozen=True)
class WarmUp:
    """What the warm-up did: its wall seconds (NaN: not recorded; its first call's included), its calls, and whether its
    timings steadied (None: a fixed warm-up, which does not look)."""

    seconds: float = math.nan
    calls: int = 0
    steady: bool | None = None
    first_s: float = 0.0  # the first call's, where the warm-up looks (its clock starts after it)

    @property
    def per_call_s(self) -> float:
        """Wall seconds per call, its eviction included (0 when nothing ran), the first call's setup left out where it
        was timed apart: the first batch's size comes from it."""
        if self.first_s and self.calls > 1:
            return (self.seconds - self.first_s) / (self.calls - 1)
        return self.seconds / self.calls if self.calls else 0.0


@dataclass(frozen=True)
class Timing:
    """Latency samples of one call in time order, in milliseconds: the median, its confidence interval, its halves,
    percentiles, outliers; why sampling stopped and what the warm-up did."""

    samples_ms: tuple[float, ...]
    method: str
    last: object = field(default=None, compare=False, repr=False)  # the checked call's output (None: not asked)
    target: float = 0.0  # the relative half-width the sampling aimed at (0: none)
    stop_reason: str = ""  # bench.spec.interval.STOP_REASONS; "": a count set in advance (stop_reason_of decides)
    warmup: WarmUp = field(default=WarmUp(), compare=False)

    def __post_init__(self):
        if not self.stop_reason:  # pytest-benchmark's rounds, a test's samples: stopped at a fixed count
            object.__setattr__(self, "stop_reason", stop_reason_of(self.samples_ms, self.target, FIXED_COUNT))

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)

    def percentile_ms(self, pct: float) -> float:
        return percentile(sorted(self.samples_ms), pct)

    @property
    def count(self) -> int:
        return len(self.samples_ms)

    @cached_property
    def interval(self) -> MedianInterval:
        return median_interval(self.samples_ms)

    @cached_property
    def halves(self) -> tuple[MedianInterval, MedianInterval]:
        """The median intervals of the first and the second half of the samples."""
        return half_intervals(self.samples_ms)

    @property
    def converged(self) -> bool:
        """Sampling stopped on its target: the interval narrow enough and the halves agreeing."""
        return self.stop_reason == TARGET

    def columns(self) -> dict:
        """The row's interval, sampling and warm-up columns (bench.spec.interval.interval_columns)."""
        return interval_columns(self.samples_ms, self.target, stop=self.stop_reason, warmup_s=self.warmup.seconds)

    @property
    def outliers(self) -> int:
        return outlier_count(self.samples_ms)


def _first_batch(per_call_s: float, cfg: TimerConfig) -> int:
    """The first batch: without a target, enough to fill the budget (the whole sampling); with one, enough for the
    minimum time. At least min_samples, at most max_samples."""
    if per_call_s <= 0:
        wanted = 0
    else:
        wanted = int(cfg.budget_s / per_call_s) if cfg.target <= 0 else math.ceil(cfg.min_time_s / per_call_s)
    return max(cfg.min_samples, min(cfg.max_samples, wanted))


def _stop(samples: Sequence[float], elapsed_s: float, cfg: TimerConfig, settled: bool = True) -> str | None:
    """The stopping rule after a batch: None to go on, else why it stops (STOP_REASONS). The sample limit; else, past
    min_samples, the time limit or (past min_time_s, and only `settled`) a positive target met by the interval of the
    median while the intervals of its halves' medians overlap. Without a target the first batch was the whole
    sampling (a fixed count). A stop at a limit says `target` where the target holds there too, `drifting` where the
    halves disagree."""
    n = len(samples)
    if cfg.target <= 0 or n >= cfg.max_samples:
        return stop_reason_of(samples, cfg.target, FIXED_COUNT if cfg.target <= 0 else SAMPLE_LIMIT)
    if n < cfg.min_samples:
        return None
    reason = stop_reason_of(samples, cfg.target, TIME_LIMIT)
    early = settled and elapsed_s >= cfg.min_time_s and reason == TARGET
    return reason if early or elapsed_s >= cfg.budget_s else None


def _next_batch(samples: Sequence[float], elapsed_s: float, cfg: TimerConfig) -> int:
    """How many more samples before the next look: the count the target needs if the half-width shrinks as
    1/sqrt(n), at least a quarter more and at most as many again (a look costs a sort), within the time left
    and max_samples, and enough to reach min_time_s."""
    n = len(samples)
    per_call = elapsed_s / n if n else 0.0
    rel = median_interval(samples).rel_half_width
    need = math.ceil(n * (rel / cfg.target) ** 2) - n if math.isfinite(rel) and rel > 0 else n
    k = min(max(need, n // 4, 1), max(n, 1))
    if per_call > 0:
        k = max(k, math.ceil((cfg.min_time_s - elapsed_s) / per_call))
        k = min(k, max(1, int((cfg.budget_s - elapsed_s) / per_call)))
    return max(1, min(k, cfg.max_samples - n))


def adaptive_samples(take: Callable[[int], Sequence[float]], cfg: TimerConfig, per_call_s: float,
                     clock: Callable[[], float] = time.perf_counter, settled: bool = True) -> tuple[list[float], str]:
    """Samples from `take(k)` (k timed calls, their latencies in ms) in batches until the stopping rule holds, and why
    it stopped; `per_call_s` is the warm-up's wall seconds per call (0: unknown), `clock` the wall clock of the time
    limits. Not `settled` (a warm-up whose timings did not steady), the target waits for the time limit: the halves
    then span the whole budget, long enough to show a drift the warm-up saw go on."""
    samples: list[float] = []
    start = clock()
    k = _first_batch(per_call_s, cfg)
    while True:
        samples += take(k)
        elapsed = clock() - start
        reason = _stop(samples, elapsed, cfg, settled)
        if reason is not None:
            return samples, reason
        k = _next_batch(samples, elapsed, cfg)


def _calls(fn: Callable[[], object] | Sequence[Callable[[], object]]) -> list[Callable[[], object]]:
    calls = [fn] if callable(fn) else list(fn)
    if not calls:
        raise ValueError("calls: need at least one call to time")
    return calls


def _warm_up(calls, cfg: TimerConfig, sync: Callable[[], None], evict: Callable[[], None] | None = None,
             clock: Callable[[], float] = time.perf_counter) -> WarmUp:
    """Run the calls in turn past warmup_s and warmup_calls. With a cap past a positive warmup_s (max_warmup_s) each
    call is timed on `clock` with its sync (its eviction outside), in windows of warmup_s / WARMUP_WINDOWS seconds and
    WINDOW_CALLS calls at least, and the warm-up goes on, to the cap at most, until its timings are steady: the
    medians of the latest window and of the one two windows before it each inside the other's 95% interval (a drift
    too slow to show between neighbouring windows shows across two). The samples go on from the next call in turn,
    so the first sample never rereads what warm-up just read."""
    looks, window_s = 0 < cfg.warmup_s < cfg.max_warmup_s, cfg.warmup_s / WARMUP_WINDOWS
    windows: deque[MedianInterval] = deque(maxlen=WARMUP_WINDOWS)
    n, start, steady, first = 0, clock(), False, 0.0
    window, opened = [], start
    while True:
        elapsed = clock() - start
        if n >= cfg.warmup_calls and elapsed >= cfg.warmup_s and (not looks or steady or elapsed >= cfg.max_warmup_s):
            return WarmUp(first + elapsed, n, steady if looks else None, first)
        if evict is not None:
            evict()
        begun = clock()
        calls[n % len(calls)]()
        sync()
        n += 1
        if looks and n == 1:  # a process's first call carries its setup (a JIT, a library's handle): the warm-up's
            first = clock() - start  # clock starts after it, so that it never spends the warm-up alone
            start = opened = clock()
        elif looks:
            ended = clock()
            window.append(ended - begun)
            if ended - opened >= window_s and len(window) >= WINDOW_CALLS:
                windows.append(median_interval(window))
                window, opened = [], ended
                steady = len(windows) == WARMUP_WINDOWS and medians_agree(windows[0], windows[-1])


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
    warm = _warm_up(calls, cfg, lambda: None, evict)
    turn = {"next": warm.calls}

    def take(k: int) -> list[float]:
        samples = []
        for _ in range(k):
            call = calls[turn["next"] % len(calls)]
            turn["next"] += 1
            if evict is not None:
                evict()
            t0 = time.perf_counter_ns()
            call()
            samples.append((time.perf_counter_ns() - t0) / 1e6)
        return samples

    gc_was_on = gc.isenabled()
    gc.disable()  # as timeit does: a collection would land inside a random sample
    try:
        with _samples_range(range_name, payload):
            samples, stop = adaptive_samples(take, cfg, warm.per_call_s, settled=warm.steady is not False)
    finally:
        if gc_was_on:
            gc.enable()
    last = checked_call(calls[turn["next"] % len(calls)], lambda: None, before_last, guard_last)
    return Timing(tuple(samples), "perf_counter_ns", last, cfg.target, stop, warm)


def one_call(elapsed_ms: float) -> Timing:
    """The timing of one call timed elsewhere (Triton's interpreter: the gate's first call, seconds a call, not
    speed): no warm-up, no interval, its output judged where it ran."""
    return Timing((float(elapsed_ms),), "perf_counter_ns", None, 0.0, FIXED_COUNT, WarmUp(0.0, 0, None))


def time_cuda(fn: Callable[[], object] | Sequence[Callable[[], object]], device: torch.device,
              cfg: TimerConfig = TimerConfig(), range_name: str | None = None, payload=None,
              stream: torch.cuda.Stream | None = None, before_last: Callable[[], None] | None = None,
              guard_last: Guard | None = None) -> Timing:
    """CUDA events around each call; an L2 flush (outside the events) before each one.

    range_name: NVTX range (with payload) around the samples only, after warm-up and graph capture,
    closed once the last sample has finished on the GPU; each flush sits in a nested 'l2flush' range.
    With several calls each is taken in turn (each captured in a graph of its own with cuda_graph); the output kept
    is the checked call's, the next in turn after the samples (with cuda_graph, the graph's output after one more
    replay: a replay allocates nothing, it reruns the captured kernels into the graph's own output, which is
    NaN-filled first: checked_replay).
    stream: run, record and wait on that stream only (a call timed beside work on other streams); by default the
    current stream, and waits synchronise the whole device.
    before_last, guard_last: run before and around the checked call (enqueued work outside the events).
    """
    if stream is not None:
        with torch.cuda.stream(stream):
            return _time_cuda(fn, device, cfg, range_name, payload, stream.synchronize, before_last, guard_last)
    return _time_cuda(fn, device, cfg, range_name, payload, torch.cuda.synchronize, before_last, guard_last)


def checked_replay(replay: Callable[[], object], static, sync: Callable[[], None], returned: Collection[int] = (),
                   before_last: Callable[[], None] | None = None, guard_last: Guard | None = None) -> object:
    """The checked call of a CUDA graph: its static output NaN-filled (integers their largest value), then one more
    replay as checked_call makes it, whose output is the static one; what the replay does not rewrite cannot hold the
    previous replay's right answer. Tensors whose storage is in `returned` (what the call returned of its inputs: an
    in-place op's caches, whose rows to write `before_last` poisons) are left as they are. None when nothing checks."""
    if before_last is None and guard_last is None:
        return None
    scrub(static, skip=returned)
    checked_call(replay, sync, before_last, guard_last)
    return static


def _time_cuda(fn, device: torch.device, cfg: TimerConfig, range_name: str | None, payload,
               sync: Callable[[], None], before_last: Callable[[], None] | None = None,
               guard_last: Guard | None = None) -> Timing:
    calls = _calls(fn)
    warm = _warm_up(calls, cfg, sync)
    runs, static, returned = calls, [None] * len(calls), [set()] * len(calls)
    if cfg.cuda_graph:
        runs = []
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for i, call in enumerate(calls):
                graph = torch.cuda.CUDAGraph()
                first = call()  # allocations of the first call happen outside the capture
                with torch.cuda.graph(graph, stream=stream):
                    static[i] = call()  # replays rewrite this output in place
                # what both calls return is what they return of their inputs (an in-place op's caches: held until
                # here, no fresh output of the capture shares an address with the first's); the checked replay
                # leaves it unfilled
                returned[i] = storages(first) & storages(static[i])
                del first
                runs.append(graph.replay)
        torch.cuda.current_stream(device).wait_stream(stream)
    flush = l2_flush_buffer(device) if cfg.flush_l2 else None
    take = EventBatches(runs, flush, sync)
    sync()  # the range opens on an idle GPU: nothing of the warm-up or the capture runs inside it
    with _samples_range(range_name, payload):
        samples, stop = adaptive_samples(take, cfg, warm.per_call_s, settled=warm.steady is not False)
    at = take.next % len(runs)
    if cfg.cuda_graph:
        last = checked_replay(runs[at], static[at], sync, returned[at], before_last, guard_last)
    else:
        last = checked_call(runs[at], sync, before_last, guard_last)
    return Timing(tuple(samples), "cuda-graph+events" if cfg.cuda_graph else "cuda-events", last, cfg.target, stop,
                  warm)


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
