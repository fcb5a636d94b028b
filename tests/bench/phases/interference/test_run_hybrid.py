"""The hybrid form's rows from what the rounds collected: the tail, TTFT, chunking's cost, and the whole model's
figures with the head counted once, at its time alone."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from phasebench.bench.phases.interference.run_hybrid import Scenario, hybrid_rows
from phasebench.bench.spec.interference_schema import WHOLE
from phasebench.bench.spec.models import DecoderConfig

MODEL = DecoderConfig(hidden=64, intermediate=96, layers=32, q_heads=4, kv_heads=2, head_dim=16, vocab=97,
                      name="tiny-32")


def _scenario(rng, iterations: int, step_ms: float, arrivals: int) -> Scenario:
    one = Scenario(iterations=iterations)
    for _ in range(arrivals):
        spans = list(step_ms * (1 + 0.1 * rng.random(iterations)))
        one.itl_ms += spans
        one.ttft_ms.append(sum(spans))
        one.decode_only_ms += list(2.0 * (1 + 0.1 * rng.random(8)))
    return one


def test_a_hybrid_row_counts_the_head_once_at_its_time_alone():
    rng = np.random.default_rng(11)
    cfg = SimpleNamespace(batches=(3,), prompts=(200,), chunks=(64, WHOLE, 256), arrivals=3, layers=2, model=MODEL)
    found = {(3, 200, 64): _scenario(rng, 4, 7.0, 3), (3, 200, WHOLE): _scenario(rng, 1, 40.0, 3)}
    rows = {r["chunk"]: r for r in hybrid_rows(cfg, found, {200: [30.0, 31.0, 29.0]}, lambda batch: 1.5)}
    assert rows["256"]["status"] == "skipped" and "more than the prompt's 200" in rows["256"]["reason"]
    for chunk in ("64", WHOLE):
        row, one = rows[chunk], found[(3, 200, 64 if chunk == "64" else WHOLE)]
        mean = float(np.mean(one.itl_ms))
        assert row["samples"] == len(one.itl_ms) == 3 * row["iterations"]
        assert row["itl_mean_ms"] == pytest.approx(mean)
        assert row["itl_p99_ms"] <= row["itl_max_ms"] == pytest.approx(max(one.itl_ms))
        # the prompt's tokens make the iteration longer, they do not slow the head: 1.5 ms, not 1.5 x the stretch
        assert row["head_ms"] == 1.5
        assert row["model_itl_ms"] == pytest.approx(1.5 + (mean - 1.5) * 16)
        assert row["whole_model"] == "scaled from 2 of 32 layers"
        assert row["ttft_ms"] == pytest.approx(float(np.median(one.ttft_ms)))
        assert row["prefill_slowdown"] == pytest.approx(row["ttft_ms"] / 30.0)
    assert rows["64"]["chunk_cost"] == pytest.approx(rows["64"]["ttft_ms"] / rows[WHOLE]["ttft_ms"])
    assert rows["64"]["chunk_cost"] < 1  # 4 x 7 ms against one 40 ms iteration
    assert rows[WHOLE]["chunk_cost"] == 1.0
