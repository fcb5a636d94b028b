"""Timer statistics and sample-count adaptation (no time is asserted)."""

from __future__ import annotations

import pytest
from phasebench.bench.timing import TimerConfig, Timing, _sample_count, time_cpu


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
