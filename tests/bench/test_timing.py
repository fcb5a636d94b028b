"""Timer statistics and sample-count adaptation (no time is asserted)."""

from __future__ import annotations

import contextlib

import pytest
import torch
from phasebench.bench import timing as timing_mod
from phasebench.bench.timing import TimerConfig, Timing, _sample_count, time_call, time_cpu


def test_percentiles_and_median_of_known_samples():
    t = Timing((5.0, 1.0, 3.0, 2.0, 4.0), "test")
    assert t.median_ms == 3.0 and t.count == 5
    assert t.percentile_ms(0) == 1.0 and t.percentile_ms(100) == 5.0
    assert t.percentile_ms(20) == pytest.approx(1.8) and t.percentile_ms(80) == pytest.approx(4.2)


def test_sample_count_adapts_to_the_budget_within_bounds():
    cfg = TimerConfig(budget_s=1.0, min_samples=5, max_samples=100)
    assert _sample_count(0.02, cfg) == 50
    assert _sample_count(10.0, cfg) == 5
    assert _sample_count(1e-9, cfg) == 100


def test_cpu_timer_warms_up_then_samples_each_call():
    calls = []
    cfg = TimerConfig(warmup_s=0.0, budget_s=0.0, min_samples=7, max_samples=7)
    timing = time_cpu(lambda: calls.append(1), cfg)
    assert timing.count == 7 and len(calls) == 8  # one warm-up call, then one per sample
    assert all(s >= 0 for s in timing.samples_ms) and timing.method == "perf_counter_ns"


@pytest.fixture
def events(monkeypatch):
    """A log of ("open", name, payload) / ("close", name) from the nvtx_range timing.py uses."""
    log = []

    @contextlib.contextmanager
    def recorder(name, payload=None, color=None):
        log.append(("open", name, payload))
        try:
            yield
        finally:
            log.append(("close", name))

    monkeypatch.setattr(timing_mod, "nvtx_range", recorder)
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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
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
