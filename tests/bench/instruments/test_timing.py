"""Timer statistics, the warm-up, sample-count adaptation and the stopping rule (driven by synthetic sample streams
and simulated calls on a fake clock: no real time is asserted)."""

from __future__ import annotations

import contextlib
import dataclasses
import math

import numpy as np
import pytest
import torch
from phasebench.bench.instruments import cuda_events
from phasebench.bench.instruments import timing as timing_mod
from phasebench.bench.instruments.cuda_events import EventBatches
from phasebench.bench.instruments.timing import (
    TimerConfig,
    Timing,
    WarmUp,
    _first_batch,
    _warm_up,
    adaptive_samples,
    time_call,
    time_cpu,
    time_cuda,
)
from phasebench.bench.spec.interval import INTERVAL_COLUMNS, median_interval
from phasebench.bench.sweep.runner import CPU_TIMER, CUDA_TIMER


def test_percentiles_and_median_of_known_samples():
    t = Timing((5.0, 1.0, 3.0, 2.0, 4.0), "test")
    assert t.median_ms == 3.0 and t.count == 5
    assert t.percentile_ms(0) == 1.0 and t.percentile_ms(100) == 5.0
    assert t.percentile_ms(20) == pytest.approx(1.8) and t.percentile_ms(80) == pytest.approx(4.2)


def test_sample_count_adapts_to_the_budget_within_bounds():
    cfg = TimerConfig(budget_s=1.0, min_samples=5, max_samples=100)
    assert _first_batch(0.02, cfg) == 50
    assert _first_batch(10.0, cfg) == 5
    assert _first_batch(1e-9, cfg) == 100


class Stream:
    """A synthetic sample stream on a fake clock: each call takes `per_call_s` of wall time and reads a latency drawn
    from `draw(rng)` ms; `batches` records the batch sizes the sampler asked for."""

    def __init__(self, draw, per_call_s: float, seed: int = 43):
        self.draw, self.per_call_s, self.rng = draw, per_call_s, np.random.default_rng(seed)
        self.now, self.batches = 0.0, []

    def clock(self) -> float:
        return self.now

    def take(self, k: int) -> list[float]:
        self.batches.append(k)
        self.now += k * self.per_call_s
        return [float(self.draw(self.rng)) for _ in range(k)]


ADAPTIVE = TimerConfig(budget_s=0.5, min_samples=10, max_samples=5000, target=0.01, min_time_s=0.05)


def _sampled(stream: Stream, cfg: TimerConfig = ADAPTIVE) -> tuple[list[float], str]:
    return adaptive_samples(stream.take, cfg, stream.per_call_s, clock=stream.clock)


def test_a_tight_stream_stops_on_the_target_after_the_minimum_time_and_samples():
    stream = Stream(lambda rng: rng.normal(2.0, 0.02), per_call_s=1e-4)
    samples, reason = _sampled(stream)
    found = median_interval(samples)
    assert reason == "target" and found.converged(ADAPTIVE.target)
    assert Timing(tuple(samples), "fake", target=ADAPTIVE.target, stop_reason=reason).converged
    assert stream.now >= ADAPTIVE.min_time_s and len(samples) >= ADAPTIVE.min_samples
    assert stream.now < ADAPTIVE.budget_s  # stopped by the target, not the time limit
    # each look but the last found the interval still too wide: the rule stopped at the first look that met it
    for end in np.cumsum(stream.batches)[:-1]:
        assert not median_interval(samples[:end]).converged(ADAPTIVE.target) or end * stream.per_call_s < 0.05


def test_a_noisy_stream_stops_at_the_time_limit_unconverged():
    stream = Stream(lambda rng: rng.lognormal(0.0, 0.8), per_call_s=1e-3)
    samples, reason = _sampled(stream)
    assert stream.now >= ADAPTIVE.budget_s and len(samples) < ADAPTIVE.max_samples
    assert stream.now - stream.batches[-1] * stream.per_call_s < ADAPTIVE.budget_s  # no batch began past the limit
    timing = Timing(tuple(samples), "fake", target=ADAPTIVE.target, stop_reason=reason)
    assert reason == "time limit" and not timing.converged and timing.interval.rel_half_width > ADAPTIVE.target


def test_a_constant_stream_still_waits_for_the_minimum_time():
    stream = Stream(lambda rng: 1.0, per_call_s=7e-4)
    samples, reason = _sampled(stream)
    assert median_interval(samples).rel_half_width == 0 and reason == "target"
    assert stream.now >= ADAPTIVE.min_time_s and len(samples) == stream.batches[0] == 72  # ceil(0.05 / 7e-4)


def test_the_sample_limit_and_the_minimum_count_bound_the_sampling():
    capped = Stream(lambda rng: rng.lognormal(0.0, 0.8), per_call_s=1e-6)
    samples, reason = _sampled(capped, dataclasses.replace(ADAPTIVE, max_samples=333))
    assert len(samples) == 333 and reason == "sample limit"
    slow = Stream(lambda rng: rng.lognormal(0.0, 0.8), per_call_s=2.0)  # one call past the whole time limit
    samples, reason = _sampled(slow)
    assert len(samples) == ADAPTIVE.min_samples and slow.batches == [ADAPTIVE.min_samples] and reason == "time limit"


def test_without_a_target_one_batch_fills_the_budget():
    stream = Stream(lambda rng: rng.lognormal(0.0, 0.8), per_call_s=0.002)
    cfg = TimerConfig(budget_s=0.3, min_samples=5, max_samples=500)
    samples, reason = _sampled(stream, cfg)
    assert len(samples) == 150 and stream.batches == [150] and reason == "fixed count"


def test_batches_grow_geometrically_so_the_interval_is_looked_at_a_few_times():
    stream = Stream(lambda rng: rng.lognormal(0.0, 0.3), per_call_s=1e-5)
    samples, _ = _sampled(stream, dataclasses.replace(ADAPTIVE, budget_s=10.0, max_samples=100_000))
    totals = np.cumsum(stream.batches)
    assert all(b <= t for b, t in zip(stream.batches[1:], totals[:-1], strict=True))  # at most doubling
    assert all(b >= max(1, t // 4) for b, t in zip(stream.batches[1:], totals[:-1], strict=True))
    assert len(stream.batches) < 30 and median_interval(samples).converged(ADAPTIVE.target)


def test_a_warm_up_that_did_not_steady_keeps_the_target_from_stopping_before_the_time_limit():
    stream = Stream(lambda rng: rng.normal(2.0, 0.02), per_call_s=1e-4)
    samples, reason = adaptive_samples(stream.take, ADAPTIVE, stream.per_call_s, clock=stream.clock, settled=False)
    assert reason == "target" and stream.now >= ADAPTIVE.budget_s  # met long before, judged at the time limit


class Simulated:
    """Simulated calls on a simulated clock that each call advances by its own latency: `steady` ms times
    (1 + `warm` exp(-t / `tau`) + `slope` t), t the simulated seconds so far, times seeded lognormal noise of `sigma`
    (median 1: the steady median is `steady`)."""

    def __init__(self, seed: int, steady: float = 0.5, warm: float = 0.04, tau: float = 0.1, slope: float = 0.0,
                 sigma: float = 0.03):
        self.rng, self.now = np.random.default_rng(seed), 0.0
        self.steady, self.warm, self.tau, self.slope, self.sigma = steady, warm, tau, slope, sigma

    def clock(self) -> float:
        return self.now

    def call(self) -> float:
        factor = 1 + self.warm * math.exp(-self.now / self.tau) + self.slope * self.now
        latency = self.steady * factor * float(self.rng.lognormal(0.0, self.sigma))
        self.now += latency / 1e3
        return latency

    def take(self, k: int) -> list[float]:
        return [self.call() for _ in range(k)]

    def timing(self, cfg: TimerConfig) -> Timing:
        """The timers' own warm-up and sampler on these calls, as time_cpu and time_cuda chain them."""
        warm = _warm_up([self.call], cfg, lambda: None, clock=self.clock)
        samples, reason = adaptive_samples(self.take, cfg, warm.per_call_s, clock=self.clock,
                                           settled=warm.steady is not False)
        return Timing(tuple(samples), "simulated", target=cfg.target, stop_reason=reason, warmup=warm)


WINDOWED = TimerConfig(warmup_s=0.15, max_warmup_s=1.0)


def test_a_steady_call_warms_up_for_the_minimum_and_a_fixed_warm_up_does_not_look():
    constant = Simulated(3, steady=1.0, warm=0.0, sigma=0.0)
    warm = _warm_up([constant.call], WINDOWED, lambda: None, clock=constant.clock)
    assert warm.steady is True and WINDOWED.warmup_s <= warm.seconds < WINDOWED.warmup_s + 0.002  # the first look
    assert warm.calls == 151 and warm.per_call_s == pytest.approx(1e-3)  # the first call, then 150 on the clock
    assert warm.first_s == pytest.approx(1e-3)
    fixed = Simulated(3, steady=1.0, warm=0.5, tau=10.0)
    warm = _warm_up([fixed.call], dataclasses.replace(WINDOWED, max_warmup_s=0.1), lambda: None, clock=fixed.clock)
    assert warm.steady is None and WINDOWED.warmup_s <= warm.seconds < WINDOWED.warmup_s + 0.002
    for calls in (0, 1):  # a warm-up of 0 s (the interpreter's, a sequence's) makes its calls only, whatever the cap
        none = Simulated(3, warm=0.5, tau=10.0)
        warm = _warm_up([none.call], dataclasses.replace(WINDOWED, warmup_s=0.0, warmup_calls=calls), lambda: None,
                        clock=none.clock)
        assert warm.calls == calls and warm.steady is None


def test_a_slow_first_call_never_spends_the_warm_up_alone():
    """A fresh process's first call carries its setup (a JIT of seconds): the warm-up's clock starts after it, so the
    calls after it still warm up for the minimum (the review found one call of 2 s ending the warm-up)."""
    class Jit(Simulated):
        def call(self):
            latency = 2000.0 if self.now == 0 else super().call()
            self.now += latency / 1e3 if self.now == 0 else 0.0
            return latency

    jit = Jit(3, steady=1.0, warm=0.0, sigma=0.0)
    warm = _warm_up([jit.call], WINDOWED, lambda: None, clock=jit.clock)
    assert warm.first_s == pytest.approx(2.0) and warm.calls > 100 and warm.steady is True
    assert warm.per_call_s == pytest.approx(1e-3) and warm.seconds > 2.0 + WINDOWED.warmup_s - 1e-9


def test_the_warm_up_goes_on_until_a_slowness_has_passed_and_stops_at_its_cap_when_it_never_does():
    class Ramp(Simulated):  # twice as slow at first, the slowness passing evenly over 0.4 s
        def call(self) -> float:
            self.steady = 1.0 + max(0.0, 1 - self.now / 0.4)
            return super().call()

    ramp = Ramp(5, warm=0.0)
    warm = _warm_up([ramp.call], WINDOWED, lambda: None, clock=ramp.clock)
    assert warm.steady is True and 0.4 <= warm.seconds < WINDOWED.max_warmup_s
    trend = Simulated(5, warm=0.0, slope=0.5)  # 50% slower each second, for ever
    warm = _warm_up([trend.call], WINDOWED, lambda: None, clock=trend.clock)
    assert warm.steady is False and WINDOWED.max_warmup_s <= warm.seconds < WINDOWED.max_warmup_s + 0.002


TIMERS = pytest.mark.parametrize("timer", [CPU_TIMER, CUDA_TIMER], ids=["host", "cuda"])


@TIMERS
def test_a_warm_up_slowness_that_fades_leaves_intervals_that_hold_the_steady_median(timer):
    """The issue's model: a call 4% slower at first, fading over 0.1 s, with 3% lognormal noise, under the runner's
    timers. Over 200 seeds 94% of the intervals hold the steady median (0.5 ms), as many as without the slowness; the
    bound 85% lies five binomial standard errors (1.7%) below that. The timers before (a fixed warm-up, 0.05 s on the
    host and 0.1 s on CUDA, and a stop at the first narrow interval) held it in 0 and 27 of these 200 runs."""
    runs = [Simulated(seed).timing(timer) for seed in range(200)]
    covered = sum(t.interval.low <= 0.5 <= t.interval.high for t in runs)
    assert covered >= 0.85 * len(runs)
    assert all(t.warmup.seconds > timer.warmup_s for t in runs if not t.warmup.steady)  # went on while unsteady


@TIMERS
def test_stationary_samples_stop_on_the_target_and_are_not_called_drifting(timer):
    """Without a drift the warm-up steadies at a look with about 83% (two medians of one distribution, each inside
    the other's 95% interval: |Z1 - Z2| < 1.96 with variance 2) and has several looks before its cap; two halves'
    95% intervals are disjoint with under 1% at a look, and drifting needs that at the last one."""
    runs = [Simulated(seed, warm=0.0).timing(timer) for seed in range(200)]
    assert sum(t.warmup.steady for t in runs) >= 185
    assert sum(t.stop_reason == "target" for t in runs) >= 196 and sum(t.stop_reason == "drifting" for t in runs) <= 2
    assert sum(t.interval.low <= 0.5 <= t.interval.high for t in runs) >= 0.85 * len(runs)


@TIMERS
def test_a_drift_that_never_ends_stops_at_a_limit_as_drifting_with_halves_that_disagree(timer):
    """A call 20% slower each second, for ever: the warm-up never steadies and stops at its cap, the target waits
    for the time limit, and there the intervals of the two halves' medians are disjoint."""
    for seed in range(20):
        timing = Simulated(seed, warm=0.0, slope=0.2).timing(timer)
        first, second = timing.halves
        assert timing.warmup.steady is False and timing.warmup.seconds >= timer.max_warmup_s
        assert timing.stop_reason == "drifting" and not timing.converged and first.high < second.low
        columns = timing.columns()
        assert columns["drifting"] and columns["stop_reason"] == "drifting" and not columns["converged"]
        assert columns["first_half_ms"] == first.median < columns["second_half_ms"] == second.median


def test_a_timing_without_a_stop_reason_stopped_at_a_fixed_count_and_says_how_it_ended():
    rng = np.random.default_rng(17)
    flat = tuple(float(x) for x in rng.lognormal(0.0, 0.03, 37))
    assert Timing(flat, "rounds").stop_reason == "fixed count"  # no target: none to meet
    assert Timing(flat, "rounds", target=0.05).stop_reason == "target"
    moved = flat[:18] + tuple(2 * x for x in flat[18:])
    timing = Timing(moved, "rounds", target=0.05)
    assert timing.stop_reason == "drifting" and not timing.converged
    columns = timing.columns()
    assert set(columns) == set(INTERVAL_COLUMNS) and math.isnan(columns["warmup_s"])  # no warm-up recorded
    assert Timing(flat, "x", warmup=WarmUp(0.25, 9, True)).columns()["warmup_s"] == 0.25
    assert Timing((1.5,), "interpreter").stop_reason == "fixed count"  # one sample: no halves to disagree


class FakeEvent:
    """A CUDA event on a fake clock: record() reads the clock, elapsed_time() the difference in ms."""

    def __init__(self, clock):
        self.clock, self.at = clock, None

    def record(self):
        self.at = self.clock["now"]

    def elapsed_time(self, end) -> float:
        return (end.at - self.at) * 1e3


def test_event_batches_flush_before_each_call_and_take_the_calls_in_turn_across_batches():
    clock, log = {"now": 0.0}, []

    def run(i):
        def call():
            log.append(("call", i))
            clock["now"] += 0.001 * (i + 1)
            return f"out{i}"
        return call

    class Flush:  # whatever the flush calls on its buffer
        def __getattr__(self, name):
            return lambda *args, **kwargs: log.append(("flush",))

    take = EventBatches([run(0), run(1), run(2)], Flush(), lambda: log.append(("sync",)),
                        event=lambda: FakeEvent(clock))
    first = take(4)
    assert first == pytest.approx([1.0, 2.0, 3.0, 1.0])  # the calls in turn, each between its own events
    assert log == [("flush",), ("call", 0), ("flush",), ("call", 1), ("flush",), ("call", 2),
                   ("flush",), ("call", 0), ("sync",)]
    log.clear()
    assert take(2) == pytest.approx([2.0, 3.0]) and take.next == 6  # the turn goes on across batches
    assert log == [("flush",), ("call", 1), ("flush",), ("call", 2), ("sync",)]


class RecordingBuffer:
    """A stand-in for the L2 flush buffer that records each method called on it and what it is: a write (an in-place
    method: its name ends in `_`) or a read."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        def method(*args, **kwargs):
            self.calls.append(("write" if name.endswith("_") else "read", name))
            return torch.zeros(())
        return method


def test_the_l2_flush_reads_its_buffer_and_never_writes_it():
    # zeroing the buffer left L2 full of dirty lines, whose write-backs the timed call then paid
    clock, buffer = {"now": 0.0}, RecordingBuffer()
    take = EventBatches([lambda: None], buffer, lambda: None, event=lambda: FakeEvent(clock))
    take(3)
    assert [kind for kind, _ in buffer.calls] == ["read"] * 3, buffer.calls  # one read before each call
    x = torch.arange(1000, dtype=torch.int32)
    cuda_events.flush_l2(x)
    assert torch.equal(x, torch.arange(1000, dtype=torch.int32))


class FakeGraph:
    """torch.cuda.CUDAGraph on the host: no kernel is recorded; replay() runs the test's `kernel` again into the output
    the captured call returned (the graph's static output)."""

    capturing, kernel, static = False, None, None

    def replay(self):
        FakeGraph.kernel(FakeGraph.static)


@contextlib.contextmanager
def fake_capture(graph, stream=None):
    FakeGraph.capturing = True
    try:
        yield
    finally:
        FakeGraph.capturing = False


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda's streams, graphs and events faked on the host, so that _time_cuda's graph path runs without a GPU;
    the test sets FakeGraph.kernel, and its call records its output as FakeGraph.static while capturing."""
    clock = {"now": 0.0}

    class Stream:
        def __init__(self, *args, **kwargs):
            pass

        def wait_stream(self, other):
            pass

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", fake_capture)
    monkeypatch.setattr(torch.cuda, "Event", lambda enable_timing=True: FakeEvent(clock))
    yield
    FakeGraph.kernel = FakeGraph.static = None


GRAPH = TimerConfig(warmup_s=0.0, budget_s=0.0, min_samples=4, max_samples=4, flush_l2=False, cuda_graph=True)


def captured(kernel, output):
    """A call that runs `kernel` into `output()` and returns it; its output while capturing is the static one."""
    FakeGraph.kernel = kernel

    def call():
        out = output()
        kernel(out)
        if FakeGraph.capturing:
            FakeGraph.static = out
        return out
    return call


def test_the_checked_replay_rewrites_a_static_output_filled_with_nan(fake_cuda):
    """A kernel right on its first calls that stops writing its last 64 elements: each replay writes into the
    graph's one static output, which still held an earlier replay's right answer at the checked replay."""
    x, calls = torch.randn(300, generator=torch.Generator().manual_seed(3)), []

    def kernel(out):
        calls.append(1)
        stop = 300 if len(calls) <= 4 else 236  # the warm-up, the call before the capture, the capture, one replay
        torch.mul(x[:stop], 2.0, out=out[:stop])

    call = captured(kernel, lambda: torch.empty(300))  # a fresh output (the capture's from the graph's own pool)
    timing = timing_mod._time_cuda(call, torch.device("cuda"), GRAPH, None, None, lambda: None,
                                   guard_last=contextlib.nullcontext)
    out = timing.last
    assert out is FakeGraph.static and timing.count == 4 and len(calls) == 3 + 4 + 1
    assert torch.equal(out[:236], x[:236] * 2) and torch.isnan(out[236:]).all()  # the stale tail is NaN


def test_the_checked_replay_leaves_the_inputs_an_in_place_op_returns(fake_cuda):
    """kv_append returns its caches: only the rows it writes are poisoned (by before_last), the rest kept."""
    cache, rows = torch.randn(50, 8, generator=torch.Generator().manual_seed(4)), torch.tensor([47, 48, 49])
    new, kept = torch.ones(3, 8), cache[:47].clone()
    call = captured(lambda out: out.index_copy_(0, rows, new), lambda: cache)
    timing = timing_mod._time_cuda(call, torch.device("cuda"), GRAPH, None, None, lambda: None,
                                   before_last=lambda: cache.index_fill_(0, rows, float("nan")))
    assert timing.last is cache and torch.equal(cache[:47], kept) and torch.equal(cache[47:], new)


def test_cpu_timer_warms_up_then_samples_each_call():
    calls = []
    cfg = TimerConfig(warmup_s=0.0, budget_s=0.0, min_samples=7, max_samples=7)
    timing = time_cpu(lambda: calls.append(sum(range(20000))), cfg)  # tens of microseconds: past any clock's step
    assert timing.count == 7 and len(calls) == 8  # one warm-up call, then one per sample
    assert all(s > 0 for s in timing.samples_ms) and timing.method == "perf_counter_ns"


def test_cpu_timer_takes_the_calls_in_turn_and_evicts_before_each():
    log = []
    calls = [lambda i=i: log.append(("call", i)) or i for i in range(3)]
    cfg = TimerConfig(warmup_s=0.0, budget_s=0.0, min_samples=7, max_samples=7)
    timing = time_cpu(calls, cfg, evict=lambda: log.append(("evict",)))
    made = [e[1] for e in log if e[0] == "call"]
    assert made == [i % 3 for i in range(8)]  # one warm-up call, then the samples go on in turn from the next
    assert all(log[2 * i] == ("evict",) for i in range(8)) and len(log) == 16  # an eviction before every call
    assert timing.count == 7 and timing.last is None  # nothing asked for a checked call: none was made


def test_the_checked_call_comes_after_the_samples_in_turn_and_keeps_its_output():
    outputs = iter(range(100))
    cfg = TimerConfig(warmup_s=0.0, budget_s=0.0, min_samples=5, max_samples=5)
    timing = time_cpu(lambda: next(outputs), cfg, guard_last=contextlib.nullcontext)
    assert timing.last == 6 and timing.count == 5  # warm-up 0, samples 1..5, the checked call 6
    with pytest.raises(ValueError, match="calls: need at least one"):
        time_cpu([], cfg)


def test_before_last_and_the_guard_wrap_the_checked_call_only_outside_the_clock():
    log = []

    @contextlib.contextmanager
    def guard():
        log.append(("enter",))
        yield
        log.append(("exit",))

    calls = [lambda i=i: log.append(("call", i)) or i for i in range(2)]
    cfg = TimerConfig(warmup_s=0.0, budget_s=0.0, min_samples=5, max_samples=5)
    timing = time_cpu(calls, cfg, evict=lambda: log.append(("evict",)), before_last=lambda: log.append(("last",)),
                      guard_last=guard)
    assert log.count(("last",)) == log.count(("enter",)) == 1 and timing.count == 5
    # the checked call is the next in turn after the five samples, the poison's guard around it alone
    assert log[-4:] == [("last",), ("enter",), ("call", timing.last), ("exit",)] and timing.last == 0
    assert [e for e in log if e[0] == "call"] == [("call", i % 2) for i in range(7)]


@pytest.mark.cuda
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "cuda_graph"])
def test_cuda_before_last_rewrites_what_only_the_last_replay_must_write_again(graph):
    device = torch.device("cuda")
    x, out = torch.randn(4096, device=device), torch.empty(4096, device=device)

    def call():
        return torch.mul(x, 2.0, out=out)  # in place, as kv_append writes its caches

    cfg = TimerConfig(warmup_s=0.002, budget_s=0.0, min_samples=6, max_samples=6, cuda_graph=graph)
    timing = time_cuda(call, device, cfg, before_last=lambda: out.fill_(float("nan")))
    torch.cuda.synchronize()
    assert torch.equal(timing.last, x * 2)  # poisoned before the checked call (or replay), rewritten by it


@pytest.fixture
def events(monkeypatch):
    """A log of ("open", name, payload) / ("close", name) from the nvtx_range timing.py and cuda_events.py use."""
    log = []

    @contextlib.contextmanager
    def recorder(name, payload=None, color=None):
        log.append(("open", name, payload))
        try:
            yield
        finally:
            log.append(("close", name))

    monkeypatch.setattr(timing_mod, "nvtx_range", recorder)
    monkeypatch.setattr(cuda_events, "nvtx_range", recorder)  # the l2flush ranges
    return log


def _split(log, name):
    """(before the range opens, inside it) of a log holding exactly one range `name`."""
    opens = [i for i, e in enumerate(log) if e[:2] == ("open", name)]
    closes = [i for i, e in enumerate(log) if e == ("close", name)]
    assert len(opens) == 1 and len(closes) == 1 and opens[0] < closes[0]
    assert closes[0] == len(log) - 1  # nothing the timer does comes after the range
    return log[:opens[0]], log[opens[0] + 1:closes[0]]


def test_cpu_range_encloses_the_samples_only(events):
    cfg = TimerConfig(warmup_s=0.002, budget_s=0.0, min_samples=9, max_samples=9)
    t = time_call(lambda: events.append(("call",)), torch.device("cpu"), cfg, range_name="case-key", payload=123)
    before, inside = _split(events, "case-key")
    assert events[len(before)] == ("open", "case-key", 123)
    assert len(before) >= 1 and set(before) == {("call",)}  # the warm-up, all of it outside
    assert inside == [("call",)] * t.count and t.count == 9


def test_no_range_without_a_name(events):
    cfg = TimerConfig(warmup_s=0.0, budget_s=0.0, min_samples=4, max_samples=4)
    t = time_cpu(lambda: events.append(("call",)), cfg, range_name=None, payload=5)
    assert events == [("call",)] * (t.count + 1)


@pytest.mark.cuda
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "cuda_graph"])
def test_cuda_range_encloses_the_samples_and_their_flushes_only(events, graph):
    device = torch.device("cuda")
    torch.manual_seed(3)
    x = torch.randn(37, 53, device=device)
    w = torch.randn(53, 29, device=device)
    out = torch.empty(37, 29, device=device)

    def fn():
        events.append(("call",))
        torch.matmul(x, w, out=out)

    cfg = TimerConfig(warmup_s=0.002, budget_s=0.0, min_samples=6, max_samples=6, flush_l2=True, cuda_graph=graph)
    t = time_call(fn, device, cfg, range_name="case-key", payload=9.5)
    before, inside = _split(events, "case-key")
    assert len(before) >= 1 and set(before) == {("call",)}  # warm-up (and capture) outside the range
    flush = [("open", "l2flush", None), ("close", "l2flush")]
    # eager: each sample is a flush then the call; a graph replays without calling fn
    assert inside == (flush + ([] if graph else [("call",)])) * t.count and t.count == 6


@pytest.mark.cuda
def test_the_l2_flush_buffer_outsizes_l2_and_leaves_the_operands_alone():
    """The flush reads well beyond the cache (Hopper's L2 is two partitions that may both hold a line) and nothing
    else. That a read after it is slower than one from L2 is a timing: `pytest bench --expectations` measures it."""
    device = torch.device("cuda")
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    flush = timing_mod.l2_flush_buffer(device)
    assert flush.numel() * flush.element_size() >= 4 * l2
    torch.manual_seed(5)
    x = torch.rand(l2 // 4 // 4, device=device)
    before = x.double().sum()
    timing_mod.flush_l2(flush)  # as the timer does before each sample
    torch.testing.assert_close(x.double().sum(), before, rtol=0, atol=0)


@pytest.mark.cuda
def test_cuda_graph_replays_run_the_captured_kernel_once_per_sample():
    device = torch.device("cuda")
    counter = torch.zeros((), dtype=torch.int64, device=device)
    python_calls = []

    def step():
        python_calls.append(1)
        counter.add_(1)

    cfg = TimerConfig(warmup_s=0.01, budget_s=0.0, min_samples=25, max_samples=25, cuda_graph=True)
    t = time_call(step, device, cfg)
    # every Python call ran the kernel once (warm-up, the call before capture; the capture itself runs nothing),
    # and each timed sample is a replay that ran it once more
    assert t.method == "cuda-graph+events" and t.count == 25
    assert counter.item() == len(python_calls) - 1 + t.count
    assert all(s > 0 for s in t.samples_ms)


@pytest.mark.cuda
def test_a_call_timed_on_its_own_stream_waits_for_that_stream_only():
    """Beside a long spin queued on another stream, the timer returns while the spin still runs: it waited for its
    own stream only."""
    device = torch.device("cuda")
    torch.manual_seed(11)
    x = torch.randn(257, 129, device=device)
    mine, other = torch.cuda.Stream(device), torch.cuda.Stream(device)
    torch.cuda.synchronize()  # x is written before either stream reads it
    with torch.cuda.stream(other):
        torch.cuda._sleep(2_000_000_000)  # about a second of a spinning kernel
    cfg = TimerConfig(warmup_s=0.0, budget_s=0.0, min_samples=5, max_samples=5, flush_l2=False)
    t = time_call(lambda: x.sum(), device, cfg, stream=mine, guard_last=contextlib.nullcontext)
    assert not other.query()  # the spin is still running: nothing waited for it
    assert t.count == 5
    torch.testing.assert_close(t.last.cpu(), x.sum().cpu())
    other.synchronize()
