"""The hybrid form's rows from what the rounds collected: the tail only where the samples support it, TTFT with its
interval, chunking's cost, the position in the prompt apart from the arrivals' spread, and the whole model's figures
scaled from two depths, the per-iteration fixed cost added once."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from phasebench.bench.phases.interference.rows import hybrid_columns, itl_columns
from phasebench.bench.phases.interference.run_hybrid import Scenario, hybrid_rows, shallow_depth
from phasebench.bench.spec.interference_schema import WHOLE
from phasebench.bench.spec.models import DecoderConfig

MODEL = DecoderConfig(hidden=64, intermediate=96, layers=32, q_heads=4, kv_heads=2, head_dim=16, vocab=97,
                      name="tiny-32")
FIXED, LAYER = 3.0, 0.7  # ms: what runs once per iteration (head, concatenations), one layer at the first position


def _spans(rng, iterations: int, depth: int, scale: float) -> list[float]:
    """One arrival's iterations through `depth` layers: the fixed cost once, each layer slower at later positions."""
    per = scale * LAYER * (1 + 0.3 * np.arange(iterations))
    return list((FIXED + depth * per) * (1 + 0.01 * rng.random(iterations)))


def _scenario(rng, iterations: int, scale: float, arrivals: int, layers: int = 4) -> Scenario:
    one = Scenario(iterations=iterations)
    for _ in range(arrivals):
        spans = _spans(rng, iterations, layers, scale)
        one.itl_ms += spans
        one.ttft_ms.append(sum(spans))
        one.arrivals_ms.append(spans)
        one.shallow_ms.append(_spans(rng, iterations, shallow_depth(layers, MODEL.layers), scale))
        one.decode_only_ms += list(2.0 * (1 + 0.1 * rng.random(8)))
    return one


def test_a_hybrid_row_scales_every_latency_from_two_depths_with_the_fixed_cost_once():
    rng = np.random.default_rng(11)
    cfg = SimpleNamespace(batches=(3,), prompts=(200,), chunks=(64, WHOLE, 256), arrivals=7, layers=4, model=MODEL)
    found = {(3, 200, 64): _scenario(rng, 4, 1.0, 7), (3, 200, WHOLE): _scenario(rng, 1, 5.0, 7)}
    rows = {r["chunk"]: r for r in hybrid_rows(cfg, found, {200: [30.0, 31.0, 29.0]})}
    assert rows["256"]["status"] == "skipped" and "more than the prompt's 200" in rows["256"]["reason"]
    for chunk in ("64", WHOLE):
        row, one = rows[chunk], found[(3, 200, 64 if chunk == "64" else WHOLE)]
        scale = 1.0 if chunk == "64" else 5.0
        per = scale * LAYER * (1 + 0.3 * np.arange(row["iterations"]))
        assert row["samples"] == len(one.itl_ms) == 7 * row["iterations"] and row["arrivals"] == 7
        assert row["itl_mean_ms"] == pytest.approx(float(np.mean(one.itl_ms)))
        # 28 or 7 samples: no p99 (and no p90 from 7), the tail is the max of N
        assert np.isnan(row["itl_p99_ms"]) and row["itl_tail"] == f"max of {row['samples']}"
        assert row["itl_tail_ms"] == pytest.approx(max(one.itl_ms))
        # the fixed cost once, not 32 / 4 times: within the 1% noise of FIXED + 32 layers
        assert row["fixed_ms"] == pytest.approx(FIXED, rel=0.05)
        assert row["model_itl_ms"] == pytest.approx(float(np.mean(FIXED + 32 * per)), rel=0.02)
        assert row["model_ttft_ms"] == pytest.approx(float(np.sum(FIXED + 32 * per)), rel=0.02)
        assert row["model_ttft_low_ms"] <= row["model_ttft_ms"] <= row["model_ttft_high_ms"]
        assert row["ttft_low_ms"] <= row["ttft_ms"] == pytest.approx(float(np.median(one.ttft_ms)))
        assert row["whole_model"] == "from 2 and 4 of 32 layers, the per-iteration fixed cost once"
        assert row["prefill_slowdown"] == pytest.approx(row["ttft_ms"] / 30.0)
    chunked = rows["64"]
    # the position in the prompt (30% slower per layer each chunk) apart from the arrivals' 1% spread
    assert chunked["position_range_pct"] > 20 and chunked["arrival_range_pct"] < 5
    assert chunked["itl_position_max_ms"] == pytest.approx(float(np.median([a[-1] for a in
                                                                            found[(3, 200, 64)].arrivals_ms])))
    assert chunked["chunk_cost"] == pytest.approx(chunked["ttft_ms"] / rows[WHOLE]["ttft_ms"])
    assert chunked["model_chunk_cost"] == pytest.approx(chunked["model_ttft_ms"] / rows[WHOLE]["model_ttft_ms"])


def test_percentiles_need_the_samples_that_support_them():
    rng = np.random.default_rng(3)
    few, many = itl_columns(rng.random(99) + 1), itl_columns(rng.random(100) + 1)
    assert np.isnan(few["itl_p99_ms"]) and few["itl_p90_ms"] > 0 and few["itl_tail"] == "max of 99"
    assert many["itl_tail"] == "p99" and many["itl_tail_ms"] == many["itl_p99_ms"] <= many["itl_max_ms"]
    assert np.isnan(itl_columns([1.0] * 9)["itl_p90_ms"])


def test_all_layers_timed_are_not_scaled_and_one_depth_is_not_scaled_at_all():
    arrivals = [[2.0, 3.0], [2.1, 3.2], [1.9, 2.9]]
    whole = hybrid_columns(arrivals, [], 2, 32, None, 32)
    assert whole["model_ttft_ms"] == whole["ttft_ms"] and whole["whole_model"] == "all 32 layers"
    assert np.isnan(whole["ttft_low_ms"])  # 3 arrivals support no 95% interval of their median
    cut = hybrid_columns(arrivals, [], 2, 1, None, 32)
    assert "model_ttft_ms" not in cut and cut["whole_model"].startswith("not scaled")
    assert shallow_depth(1, 32) is None and shallow_depth(32, 32) is None and shallow_depth(9, 32) == 4


def test_the_whole_model_ttft_interval_keeps_the_arrivals_correlation():
    # each arrival's deep and shallow times move together so that its whole-model TTFT (deep + 2 (deep - shallow)
    # from 1 and 2 of 4 layers) is the same for every arrival: its interval has no width, where adding the
    # timed TTFT's and the extrapolation's intervals in quadrature would make it wide
    rng = np.random.default_rng(11)
    drift = rng.normal(0, 1.5, size=(9, 3))
    deep = 10.0 + drift
    shallow = 5.0 + 1.5 * drift
    row = hybrid_columns(deep.tolist(), shallow.tolist(), 1, 2, 1, 4)
    assert row["ttft_high_ms"] - row["ttft_low_ms"] > 1.0
    for name in ("model_ttft_ms", "model_ttft_low_ms", "model_ttft_high_ms"):  # 3 x 30 - 2 x 15, every arrival
        assert row[name] == pytest.approx(60.0, abs=1e-9)
    # an arrival missing at the shallow depth is left out of the pairs, not matched with the next one
    gone = hybrid_columns(deep.tolist(), [[]] + shallow[1:].tolist(), 1, 2, 1, 4)
    assert gone["model_ttft_ms"] == pytest.approx(60.0, abs=1e-9)
