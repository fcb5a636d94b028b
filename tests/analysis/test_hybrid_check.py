"""The composed hybrid iteration against `phasebench interference`'s measured one: which rows are compared, the
composition of their iterations, and the error's sign and goal."""

from __future__ import annotations

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


def hybrid(batch, prompt, chunk, itl, ttft, **fields) -> dict:
    tokens = prompt if chunk == "whole" else int(chunk)
    return {"run_id": "r1", "model": "tiny", "dtype": "float32", "device_name": "cpu", "device_kind": "cpu",
            "layers": TINY.layers, "status": "ok", "mode": "hybrid", "batch": batch, "prompt": prompt, "context": 9,
            "chunk": chunk, "chunk_tokens": tokens, "itl_mean_ms": itl, "ttft_ms": ttft, **fields}


def test_each_hybrid_row_is_composed_from_its_own_iterations_and_judged_on_the_goal():
    rows = pd.DataFrame([hybrid(3, 23, "7", 100.0, 400.0), hybrid(1, 23, "whole", 50.0, 50.0)])
    chosen = hc.hybrid_rows(rows, model="tiny", dtype="float32", device="cpu", layers=TINY.layers)
    steps = hc.hybrid_steps(TINY, chosen)
    assert len(steps) == 4 + 1  # 23 tokens in chunks of 7 (7, 7, 7, 2), and the whole prompt in one
    measured = pm.Measured(op_rows(step_defs.distinct_uses(steps), latency), model="tiny", dtype="float32")
    table = hc.hybrid_check(measured, TINY, chosen).set_index("chunk")
    chunked = [pm.step_time(measured, s).total_ms for s in step_defs.chunked_prefill_steps(TINY, 23, 7, 3, 9)]
    assert len(chunked) == 4 and table.loc["7", "iterations"] == 4
    assert table.loc["7", "composed_ttft_ms"] == pytest.approx(sum(chunked))
    assert table.loc["7", "composed_itl_ms"] == pytest.approx(sum(chunked) / 4)
    assert table.loc["7", "ttft_error_pct"] == pytest.approx(100 * (sum(chunked) - 400) / 400)
    assert table.loc["7", "itl_error_pct"] == pytest.approx(100 * (sum(chunked) / 4 - 100) / 100)
    whole = pm.step_time(measured, step_defs.hybrid_step(TINY, 1, 9, 23, 0, True)).total_ms
    assert table.loc["whole", "composed_ttft_ms"] == pytest.approx(whole) == table.loc["whole", "composed_itl_ms"]
    assert (table["missing"] == 0).all() and (table["goal_pct"] == 15).all() and table["checked"].all()
    for chunk, row in table.iterrows():
        worst = max(abs(row["itl_error_pct"]), abs(row["ttft_error_pct"]))
        assert row["over_goal"] == (worst > 15), chunk
    # measured exactly as composed: no error, nothing over the goal
    exact = pd.DataFrame([hybrid(3, 23, "7", sum(chunked) / 4, sum(chunked))])
    again = hc.hybrid_check(measured, TINY, exact)
    assert again["itl_error_pct"].abs().max() < 1e-9 and not again["over_goal"].any()
    # either side of the 15% goal: composed 14% over and 16% under what was measured
    near = pd.DataFrame([hybrid(3, 23, "7", sum(chunked) / 4 / 1.14, sum(chunked) / 1.14),
                         hybrid(3, 23, "7", sum(chunked) / 4 / 0.84, sum(chunked) / 0.84)])
    near = hc.hybrid_check(measured, TINY, near)
    assert near["ttft_error_pct"].tolist() == pytest.approx([14, -16])
    assert near["over_goal"].tolist() == [False, True]


def test_a_sequence_term_left_out_as_noisy_leaves_the_row_unchecked():
    rows = pd.DataFrame([hybrid(2, 10, "4", 1.0, 3.0)])
    steps = hc.hybrid_steps(TINY, rows)
    ops = op_rows(step_defs.distinct_uses(steps), latency)
    parts = {pm.sequence_key(part): part for s in steps for _, _, part in pm.sequence_parts(s)}
    alone = {k: sum(u.count * latency(u) for u in part) for k, part in parts.items()}  # as the sweep's rows say
    sequences = pd.DataFrame([{"key": k, "sequence": "layer", "sequence_ms": a + 1.0, "alone_ms": a, "term_ms": 1.0,
                               "status": "ok", "noisy": True} for k, a in alone.items()])
    table = hc.hybrid_check(pm.Measured(ops, model="tiny", dtype="float32", sequences=sequences), TINY, rows)
    assert table.loc[0, "missing"] == 0 and not table.loc[0, "checked"] and table.loc[0, "over_goal"]
    quiet = sequences.assign(noisy=False)
    table = hc.hybrid_check(pm.Measured(ops, model="tiny", dtype="float32", sequences=quiet), TINY, rows)
    assert table.loc[0, "checked"]


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


@pytest.mark.parametrize("fields", [{"layers": TINY.layers - 1}, {"device_name": "NVIDIA H200"}, {"status": "failed"},
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
    assert table.loc[0, "over_goal"]  # a composition it could not make is not within the goal
