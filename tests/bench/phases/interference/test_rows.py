"""What every interference row carries: the ITL's mean and tail, and the whole model's per-user figures (all layers,
or scaled from the layers timed with the head counted once, and saying which)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from phasebench.bench.phases.interference.rows import itl_columns, whole_model_columns, zero_layer_columns


def test_the_itl_columns_keep_the_tail_a_median_hides():
    # 97 quick steps and 3 stalls: the median sees none of them, the mean, p99 and max do
    samples = np.random.default_rng(5).uniform(1.0, 1.2, 100)
    samples[[10, 50, 90]] = [60.0, 70.0, 80.0]
    found = itl_columns(samples)
    assert found["itl_p50_ms"] == pytest.approx(np.median(samples)) and found["itl_p50_ms"] < 1.2
    assert found["itl_mean_ms"] == pytest.approx(samples.mean()) and found["itl_mean_ms"] > 3
    assert found["itl_p99_ms"] == pytest.approx(np.percentile(samples, 99)) and found["itl_max_ms"] == 80.0
    assert found["itl_p90_ms"] <= found["itl_p99_ms"] <= found["itl_max_ms"]
    assert found["itl_tail"] == "p99" and found["itl_tail_ms"] == found["itl_p99_ms"]
    assert all(math.isnan(v) for k, v in itl_columns([]).items() if k != "itl_tail")


def test_a_whole_model_measured_is_labelled_so_and_a_partial_one_is_scaled_with_the_head_once():
    whole = whole_model_columns(12.5, 2.0, layers=2, model_layers=2)
    assert whole["whole_model"] == "all 2 layers" and whole["model_itl_ms"] == 12.5
    assert whole["tokens_per_s_per_user"] == pytest.approx(80.0)
    scaled = whole_model_columns(12.5, 2.0, layers=2, model_layers=32)  # 10.5 ms of layers x 16, plus the head
    assert scaled["whole_model"] == "scaled from 2 of 32 layers" and scaled["model_layers"] == 32
    assert scaled["model_itl_ms"] == pytest.approx(2.0 + 10.5 * 16)
    assert scaled["tokens_per_s_per_user"] == pytest.approx(1e3 / 170.0)
    # beside a co-runner that slows the step 2x (12.5 against 6.25 ms alone), the head timed alone counts slowed
    # alike, once: 4 ms of head and 8.5 ms of layers x 16
    slowed = whole_model_columns(12.5, 2.0, layers=2, model_layers=32, alone_mean_ms=6.25)
    assert slowed["head_ms"] == 4.0 and slowed["model_itl_ms"] == pytest.approx(4.0 + 8.5 * 16)
    # no head timing: the whole model's figure is known only where every layer was timed
    assert whole_model_columns(12.5, math.nan, 2, 2)["model_itl_ms"] == 12.5
    assert math.isnan(whole_model_columns(12.5, math.nan, 2, 32)["tokens_per_s_per_user"])


def test_the_zero_layer_columns_take_the_median_arrival_and_the_slowest_positions_own_time():
    rng = np.random.default_rng(17)
    arrivals = [list(rng.uniform(5, 6, 4) + [0.0, 3.0, 0.0, 0.0]) for _ in range(5)]  # position 1 the slowest
    zero = [list(rng.uniform(1.1, 1.3, 4)) for _ in range(5)]
    found = zero_layer_columns(arrivals + [[7.0]], zero + [[0.5, 0.5]])  # an arrival cut short counts at neither
    assert found["zero_layer_ttft_ms"] == pytest.approx(float(np.median([sum(z) for z in zero])))
    assert found["zero_layer_slowest_ms"] == pytest.approx(float(np.median([z[1] for z in zero])))
    assert all(np.isnan(v) for v in zero_layer_columns([[1.0, 2.0]], []).values())
