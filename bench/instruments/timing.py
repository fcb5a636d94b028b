"""Timers: CUDA events with an L2 flush between calls, or perf_counter_ns on the host; warm-up by time; samples taken
in batches until the median's confidence interval is narrow enough or a time limit passes.

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
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import torch

from ...profiles.names import L2FLUSH
from ...profiles.nvtx_ranges import nvtx_range
from ..spec.interval import MedianInterval, median_interval, outlier_count, percentile
from .memory.poison import scrub, storages

# The relative half-width of the 95% interval of the median at which the runner stops sampling, per device kind: a
# GPU's events resolve a microsecond and repeat closely; the host's clock sees the scheduler and its neighbours.
CI_TARGETS = {"cuda": 0.01, "cpu": 0.02}


@dataclass(frozen=True)
class TimerConfig:
    """How long to warm up and measure one (case, impl), and the bounds on the sample count.

    With a `target`, samples come in batches until the relative half-width of the median's 95% interval is at most
    `target` (after `min_samples` and `min_time_s`), or until `budget_s` of sampling (the time limit) or
    `max_samples`; without one, the count is set once from the warm-up to fill `budget_s`."""

    warmup_s: float = 0.1
    budget_s: float = 1.0
    min_samples: int = 5
    max_samples: int = 1000
    flush_l2: bool = True
    cuda_graph: bool = False
    cold: bool = False  # host: the operands a forward pass streams are timed cold (bench.instruments.cold)
    target: float = 0.0  # relative half-width of the median's 95% interval that stops sampling (0: no target)
    min_time_s: float = 0.0  # seconds of sampling before the target may stop it
    warmup_calls: int = 1  # calls the warm-up makes at least (0 with warmup_s 0: none, the gate's call warmed it)


@dataclass(frozen=True)
class Timing:
    """Latency samples of one call, in milliseconds: the median, its confidence interval, percentiles, outliers."""

    samples_ms: tuple[float, ...]
    method: str
    last: object = field(default=None, compare=False, repr=False)  # the checked call's output (None: not asked)
    target: float = 0.0  # the relative half-width the sampling aimed at (0: none)

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

    @property
    def converged(self) -> bool:
        return self.interval.converged(self.target)

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


def _stop(samples: Sequence[float], elapsed_s: float, cfg: TimerConfig) -> bool:
    """The stopping rule after a batch: the sample limit; else, past min_samples, the time limit or (past min_time_s)
    a positive target met by the interval of the median. Without a target the first batch was the whole sampling."""
    n = len(samples)
    if cfg.target <= 0 or n >= cfg.max_samples:
        return True
    if n < cfg.min_samples:
        return False
    return elapsed_s >= cfg.budget_s or (elapsed_s >= cfg.min_time_s and median_interval(samples).converged(cfg.target))


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
                     clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Samples from `take(k)` (k timed calls, their latencies in ms) in batches until the stopping rule holds;
    `per_call_s` is the warm-up's wall seconds per call (0: unknown), `clock` the wall clock of the time limits."""
    samples: list[float] = []
    start = clock()
    k = _first_batch(per_call_s, cfg)
    while True:
        samples += take(k)
        elapsed = clock() - start
        if _stop(samples, elapsed, cfg):
            return samples
        k = _next_batch(samples, elapsed, cfg)


def _calls(fn: Callable[[], object] | Sequence[Callable[[], object]]) -> list[Callable[[], object]]:
    calls = [fn] if callable(fn) else list(fn)
    if not calls:
        raise ValueError("calls: need at least one call to time")
    return calls


def _warm_up(calls, cfg: TimerConfig, sync: Callable[[], None],
             evict: Callable[[], None] | None = None) -> tuple[float, int]:
    """Run the calls in turn until warm-up time has passed and at least `warmup_calls` ran; return the mean wall
    seconds per call, its eviction included (so that the sample count keeps the sampling near its budget; 0 when
    nothing ran), and how many calls ran (the samples go on from the next one in turn, so the first sample never
    rereads what warm-up just read)."""
    n, start = 0, time.perf_counter()
    while True:
        elapsed = time.perf_counter() - start
        if n >= cfg.warmup_calls and elapsed >= cfg.warmup_s:
            return (elapsed / n if n else 0.0), n
        if evict is not None:
            evict()
        calls[n % len(calls)]()
        sync()
        n += 1


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
    turn = {"next": offset}

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
            samples = adaptive_samples(take, cfg, per_call)
    finally:
        if gc_was_on:
            gc.enable()
    last = checked_call(calls[turn["next"] % len(calls)], lambda: None, before_last, guard_last)
    return Timing(tuple(samples), "perf_counter_ns", last, cfg.target)


def l2_flush_buffer(device: torch.device) -> torch.Tensor:
    """A buffer several times the L2 cache; reading it (flush_l2) evicts what the previous call left there."""
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 64 << 20
    return torch.empty(max(4 * l2, 256 << 20) // 4, dtype=torch.int32, device=device)


def flush_l2(buffer) -> None:
    """Evict the L2 by reading `buffer` (l2_flush_buffer) in one reduction whose result is dropped: nothing of it is
    written, so the lines it leaves are clean and the timed call pays no write-back of the flush's own (zeroing the
    buffer left L2 full of dirty lines)."""
    buffer.amax()


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


class EventBatches:
    """Timed calls on a GPU, a batch at a time: the L2 flush (outside the events) and events around each call, then
    one wait for the batch; `next` counts the calls taken (the checked call after the samples is the next in turn).
    `event` makes a timing event (a fake one in the host's tests)."""

    def __init__(self, runs, flush, sync: Callable[[], None],
                 event: Callable[[], object] = lambda: torch.cuda.Event(enable_timing=True)):
        self.runs, self.flush, self.sync, self.event = runs, flush, sync, event
        self.next = 0

    def __call__(self, k: int) -> list[float]:
        starts, ends = [self.event() for _ in range(k)], [self.event() for _ in range(k)]
        for start, end in zip(starts, ends, strict=True):
            if self.flush is not None:
                with nvtx_range(L2FLUSH):
                    flush_l2(self.flush)
            at = self.next % len(self.runs)
            self.next += 1
            start.record()
            self.runs[at]()
            end.record()
        self.sync()
        return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]


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
    per_call, _ = _warm_up(calls, cfg, sync)
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
        samples = adaptive_samples(take, cfg, per_call)
    at = take.next % len(runs)
    if cfg.cuda_graph:
        last = checked_replay(runs[at], static[at], sync, returned[at], before_last, guard_last)
    else:
        last = checked_call(runs[at], sync, before_last, guard_last)
    return Timing(tuple(samples), "cuda-graph+events" if cfg.cuda_graph else "cuda-events", last, cfg.target)


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
