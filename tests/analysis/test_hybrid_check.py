"""The composed hybrid iteration against `phasebench interference`'s measured one: which rows are compared (any layer
count: the model cut to it), the composition of their iterations, two figures with intervals and three verdicts, and
the published chunked table's rows given the verdict of their own shapes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from phasebench.analysis.phases import hybrid_check as hc
from phasebench.analysis.phases import model as pm
from phasebench.bench.spec import steps as step_defs

from .phase_rows import TINY, op_rows


def latency(use) -> float:  # a fresh, awkward latency per op: rows times a per-op weight
    f = use.field_dict
    if use.op == "attention":
        return 0.013 * f["batch"] * f["q_len"] * f["kv_len"]
    return {"linear": 0.37, "elementwise": 0.011}[use.op] * f["m"] * (1 + len(str(f)) % 5)


def hybrid(batch, prompt, chunk, slowest, ttft, **fields) -> dict:
    tokens = prompt if chunk == "whole" else int(chunk)
    return {"run_id": "r1", "model": "tiny", "dtype": "float32", "device_name": "cpu", "device_kind": "cpu",
            "layers": TINY.layers, "status": "ok", "mode": "hybrid", "batch": batch, "prompt": prompt, "context": 9,
            "chunk": chunk, "chunk_tokens": tokens, "itl_position_max_ms": slowest, "ttft_ms": ttft, **fields}


def with_ends(row: dict, rel: float) -> dict:
    """A measured row whose TTFT and slowest position carry a ±rel interval."""
    return {**row, **{f"{stem}_{end}_ms": row[f"{stem}_ms"] * (1 + sign * rel)
                      for stem in ("ttft", "itl_position_max") for end, sign in (("low", -1), ("high", 1))}}


def measured_of(steps, rel: float = 0.0) -> pm.Measured:
    rows = op_rows(step_defs.distinct_uses(steps), latency)
    if rel:
        rows = rows.assign(latency_ci_low_ms=rows["latency_ms"] * (1 - rel),
                           latency_ci_high_ms=rows["latency_ms"] * (1 + rel))
    return pm.Measured(rows, model="tiny", dtype="float32")


def test_each_hybrid_row_is_composed_from_its_own_iterations_through_its_own_layers():
    # a row of all 3 layers, and a GPU-like row of 1 of them: both checked, each against the model cut to its layers
    rows = pd.DataFrame([hybrid(3, 23, "7", 100.0, 400.0), hybrid(1, 23, "whole", 50.0, 50.0, layers=1)])
    chosen = hc.hybrid_rows(rows, model="tiny", dtype="float32", device="cpu", layers=TINY.layers)
    steps = hc.hybrid_steps(TINY, chosen)
    assert len(chosen) == 2 and len(steps) == 4 + 1  # 23 tokens in chunks of 7 (7, 7, 7, 2); the whole prompt
    measured = measured_of(steps)
    table = hc.hybrid_check(measured, TINY, chosen).set_index("chunk")
    chunked = [pm.step_time(measured, s).total_ms for s in step_defs.chunked_prefill_steps(TINY, 23, 7, 3, 9)]
    assert len(chunked) == 4 and table.loc["7", "iterations"] == 4 and table.loc["7", "layers"] == 3
    assert table.loc["7", "composed_ttft_ms"] == pytest.approx(sum(chunked))
    # the slowest iteration is a figure of its own, not the sum again: the longest composed iteration
    assert table.loc["7", "composed_slowest_ms"] == pytest.approx(max(chunked))
    assert table.loc["7", "ttft_error_pct"] == pytest.approx(100 * (sum(chunked) - 400) / 400)
    assert table.loc["7", "slowest_error_pct"] == pytest.approx(100 * (max(chunked) - 100) / 100)
    one_layer = dataclasses.replace(TINY, layers=1)
    whole = pm.step_time(measured, step_defs.hybrid_step(one_layer, 1, 9, 23, 0, True)).total_ms
    full = pm.step_time(measured, step_defs.hybrid_step(TINY, 1, 9, 23, 0, True)).total_ms
    assert table.loc["whole", "composed_ttft_ms"] == pytest.approx(whole) and whole < full
    assert (table["missing"] == 0).all() and (table["goal_pct"] == 15).all() and table["checked"].all()
    # rows without intervals (interference schema 3, op rows without theirs): no verdict
    assert (table["verdict"] == "unresolved").all() and not table["over_goal"].any()


def test_the_arrival_through_no_layer_replaces_the_composed_heads_once_per_iteration():
    plain = hybrid(3, 23, "7", 100.0, 400.0)
    timed = {**plain, "zero_layer_ttft_ms": 31.0, "zero_layer_slowest_ms": 9.5}
    chosen = hc.hybrid_rows(pd.DataFrame([plain]), model="tiny", dtype="float32", device="cpu", layers=TINY.layers)
    measured = measured_of(hc.hybrid_steps(TINY, chosen))
    before = hc.hybrid_check(measured, TINY, chosen).iloc[0]
    after = hc.hybrid_check(measured, TINY, pd.DataFrame([{**chosen.iloc[0].to_dict(), **timed}])).iloc[0]
    steps = [pm.step_time(measured, s) for s in step_defs.chunked_prefill_steps(TINY, 23, 7, 3, 9)]
    heads = sum(t.parts["head"] for t in steps)
    assert np.isnan(before["iteration_ms"]) and after["iteration_ms"] == pytest.approx(31.0 - heads)
    assert after["composed_ttft_ms"] == pytest.approx(before["composed_ttft_ms"] - heads + 31.0)
    slowest = max(steps, key=lambda t: t.total_ms)
    assert after["composed_slowest_ms"] == pytest.approx(slowest.total_ms - slowest.parts["head"] + 9.5)


def test_the_verdict_is_within_over_or_unresolved_on_the_errors_interval():
    rows = pd.DataFrame([hybrid(3, 23, "7", 1.0, 1.0)])
    steps = hc.hybrid_steps(TINY, rows)
    measured = measured_of(steps, rel=0.01)
    ttft = sum(pm.step_time(measured, s).total_ms for s in steps)
    slowest = max(pm.step_time(measured, s).total_ms for s in steps)
    # composed 2% over, 40% over, 15% over with a ±5% measured interval (straddles the goal), and 2% over without one
    cases = [with_ends(hybrid(3, 23, "7", slowest / 1.02, ttft / 1.02), 0.01),
             with_ends(hybrid(3, 23, "7", slowest / 1.02, ttft / 1.4), 0.01),
             with_ends(hybrid(3, 23, "7", slowest / 1.02, ttft / 1.15), 0.05),
             hybrid(3, 23, "7", slowest / 1.02, ttft / 1.02)]
    table = hc.hybrid_check(measured, TINY, pd.DataFrame(cases))
    assert table["ttft_error_pct"].tolist() == pytest.approx([2, 40, 15, 2])
    assert table["ttft_verdict"].tolist() == ["within", "over", "unresolved", "unresolved"]
    assert table["verdict"].tolist() == ["within", "over", "unresolved", "unresolved"]
    assert table["over_goal"].tolist() == [False, True, False, False]
    low, high = table.loc[0, ["ttft_error_low_pct", "ttft_error_high_pct"]]
    assert low < 2 < high and high - low < 5
    assert "TTFT +2.0% [" in "\n".join(hc.hybrid_lines(table))


def test_the_published_chunked_table_takes_the_verdict_of_its_own_shapes():
    # a float column beside the shape (as the composed table has), so that its rows read back as floats: 7.0
    chunked = pd.DataFrame([{"chunk": 7, "prompt": 23, "decode_batch": 3, "context": 9, "ttft_ms": 41.5},
                            {"chunk": 11, "prompt": 23, "decode_batch": 3, "context": 9, "ttft_ms": 30.25}])
    check = pd.DataFrame([{"batch": 3, "prompt": 23, "context": 9, "chunk": "7", "verdict": "within",
                           "ttft_error_pct": 3.0},
                          {"batch": 3, "prompt": 23, "context": 9, "chunk": "7", "verdict": "unresolved",
                           "ttft_error_pct": -9.0},
                          {"batch": 4, "prompt": 23, "context": 9, "chunk": "11", "verdict": "within",
                           "ttft_error_pct": 1.0}])
    check["ttft_error_low_pct"], check["ttft_error_high_pct"] = check["ttft_error_pct"] - 4, check["ttft_error_pct"] + 5
    check["measured_run"] = ["run-a", "run-b", "run-a"]
    found = hc.chunked_verdicts(chunked, check)
    assert found["check_verdict"].tolist() == ["unresolved", hc.NOT_CHECKED]
    assert found.loc[0, "check_ttft_error_pct"] == -9.0 and pd.isna(found.loc[1, "check_ttft_error_pct"])
    assert found.loc[0, ["check_ttft_error_low_pct", "check_ttft_error_high_pct"]].tolist() == [-13.0, -4.0]
    assert found.loc[0, "check_run"] == "run-b" and found["check_rows"].tolist() == [2, 0]
    # the error shown is the judged row's, not the largest: a within row of -12% beside an unresolved one of -6%
    check.loc[0, ["ttft_error_pct", "ttft_error_low_pct", "ttft_error_high_pct"]] = [-12.0, -13.0, -11.0]
    check.loc[1, ["ttft_error_pct", "ttft_error_low_pct", "ttft_error_high_pct"]] = [-6.0, -16.0, 2.0]
    again = hc.chunked_verdicts(chunked, check)
    assert again.loc[0, "check_verdict"] == "unresolved" and again.loc[0, "check_ttft_error_pct"] == -6.0
    assert [hc.chunk_label(v) for v in (7, 7.0, "7", "whole", np.nan)] == ["7", "7", "7", "whole", "nan"]


def test_noisy_rows_are_not_compared_a_row_given_twice_counts_once_and_each_run_is_checked():
    rows = pd.DataFrame([hybrid(3, 23, "7", 1.0, 4.0, noisy=True), hybrid(3, 23, "whole", 1.0, 4.0, noisy=False),
                         hybrid(3, 23, "whole", 1.0, 4.0, noisy=False),  # the same folder given twice
                         hybrid(3, 23, "whole", 2.0, 8.0, noisy=False, run_id="r2")])
    chosen = hc.hybrid_rows(rows, model="tiny", dtype="float32", device="cpu", layers=TINY.layers)
    assert chosen["chunk"].tolist() == ["whole", "whole"] and chosen["run_id"].tolist() == ["r1", "r2"]
    measured = pm.Measured(op_rows(step_defs.distinct_uses(hc.hybrid_steps(TINY, chosen)), latency), model="tiny",
                           dtype="float32")
    table = hc.hybrid_check(measured, TINY, chosen)
    # one composition, read against each run's own measurement
    assert table["measured_run"].tolist() == ["r1", "r2"] and table["composed_ttft_ms"].nunique() == 1
    assert table["measured_ttft_ms"].tolist() == [4.0, 8.0]


@pytest.mark.parametrize("fields", [{"layers": TINY.layers + 1}, {"device_name": "NVIDIA H200"}, {"status": "failed"},
                                    {"model": "other"}, {"dtype": "bfloat16"}, {"mode": "colocated"}])
def test_rows_of_another_model_device_layer_count_or_mode_are_not_compared(fields):
    rows = pd.DataFrame([hybrid(3, 23, "7", 1.0, 4.0), hybrid(3, 23, "7", 1.0, 4.0, **fields)])
    assert len(hc.hybrid_rows(rows, model="tiny", dtype="float32", device="cpu", layers=TINY.layers)) == 1
    assert hc.hybrid_rows(None, model="tiny", dtype="float32", device="cpu", layers=3).empty


def test_a_missing_op_is_counted_the_composition_is_not_a_number_and_not_within_the_goal():
    rows = pd.DataFrame([hybrid(2, 10, "4", 1.0, 3.0)])
    steps = hc.hybrid_steps(TINY, rows)
    uses = [u for u in step_defs.distinct_uses(steps) if u.op != "attention"]
    measured = pm.Measured(op_rows(uses, latency), model="tiny", dtype="float32")
    table = hc.hybrid_check(measured, TINY, rows)
    assert table.loc[0, "missing"] > 0 and pd.isna(table.loc[0, "composed_ttft_ms"])
    assert table.loc[0, "verdict"] == "unresolved"  # a composition it could not make is not within the goal
