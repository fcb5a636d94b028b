"""The sequence term's decisions (analysis.phases.sequence) and the intervals the phase model carries into its sums:
a term applied only where its turns' interval excludes no effect, pooled over a phase's shapes where that narrows it,
a ratio that cancels a drift between the sweep and the sequence row, and composed figures with their ends."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from phasebench.analysis.phases import model as pm
from phasebench.analysis.phases import sequence as seq
from phasebench.bench.spec import steps as step_defs
from phasebench.bench.spec.interval import median_interval, sum_interval

from .phase_rows import TINY, op_rows
from .test_phase_model import hand_tpot, power_latency

RNG = np.random.default_rng(4417)


def _row(step, kind: str, effects, form="ratio", noisy=False, alone_scale=1.0) -> dict:
    """A sequence row as bench.phases.op_sequence writes it, its turns' effects given."""
    (_, _, uses), = [p for p in pm.sequence_parts(step) if p[0] == kind]
    alone = alone_scale * sum(u.count * power_latency(u) for u in uses)
    effect = float(np.median(effects))
    return {"key": pm.sequence_key(uses), "sequence": kind, "phase": uses[0].field_dict.get("phase", ""),
            "sequence_ms": alone * effect if form == "ratio" else alone + effect, "alone_ms": alone,
            "form": form, "turn_effects": seq.effects_text(effects), "status": "ok", "noisy": noisy}


def _measured(steps, sequences, sigma=0.0) -> pm.Measured:
    """Rows of known latency; sigma: each row's interval of its median, ± that share of its latency."""
    rows = op_rows(step_defs.distinct_uses(steps), power_latency)
    rows["latency_ci_low_ms"] = rows["latency_ms"] * (1 - sigma)
    rows["latency_ci_high_ms"] = rows["latency_ms"] * (1 + sigma)
    return pm.Measured(rows, model="tiny", dtype="float32", sequences=pd.DataFrame(sequences))


def _layer_sum(step) -> float:
    (_, _, uses), = [p for p in pm.sequence_parts(step) if p[0] == "layer"]
    return sum(u.count * power_latency(u) for u in uses)


def test_a_ratio_whose_interval_excludes_one_is_applied_and_one_that_holds_it_is_not():
    step = step_defs.decode_step(TINY, 3, 29)
    lifted = 1.05 + 0.02 * RNG.random(6)  # every turn 5-7% slower in sequence
    m = _measured([step], [_row(step, "layer", lifted)])
    t = pm.tpot(m, TINY, 3, 29)
    assert t.parts["sequence"] == pytest.approx(TINY.layers * (np.median(lifted) - 1) * _layer_sum(step))
    # turns on both sides of 1: its interval holds no effect, so the sum is the ops alone
    straddling = np.array([0.96, 1.03, 0.99, 1.05, 0.98, 1.02])
    quiet = pm.tpot(_measured([step], [_row(step, "layer", straddling)]), TINY, 3, 29)
    assert quiet.parts["sequence"] == 0.0 and quiet.total_ms == hand_tpot(3, 29) and quiet.noisy == 0
    table = seq.decisions(pd.DataFrame([_row(step, "layer", lifted), _row(step, "head", straddling)]))
    assert table["applied"].tolist() == [True, False]
    assert "excludes no effect" in table["why"].iloc[0] and "holds no effect" in table["why"].iloc[1]


def test_a_drift_between_the_sweep_and_the_sequence_row_cancels_in_a_ratio():
    # the row's ops alone ran 1.4x the sweep's (the host drifted): a ratio of 1.1 adds 10% of the sweep's sum, where
    # a difference would have added 14% (and the agreement rule only stops drift past 1.5x)
    step = step_defs.decode_step(TINY, 2, 40)
    m = _measured([step], [_row(step, "layer", [1.1] * 6, alone_scale=1.4)])
    assert pm.tpot(m, TINY, 2, 40).parts["sequence"] == pytest.approx(TINY.layers * 0.1 * _layer_sum(step))
    # a difference (the GPU's form) keeps the agreement rule: 1.6x apart is left out as noisy
    far = _measured([step], [_row(step, "layer", [0.5] * 6, form="difference", alone_scale=1.6)])
    assert pm.tpot(far, TINY, 2, 40).parts["sequence"] == 0.0 and pm.tpot(far, TINY, 2, 40).noisy == 1
    near = _measured([step], [_row(step, "layer", [0.5] * 6, form="difference", alone_scale=1.2)])
    assert pm.tpot(near, TINY, 2, 40).parts["sequence"] == TINY.layers * 0.5


def test_a_phase_pools_its_shapes_where_that_narrows_a_shape_and_agrees_with_it():
    steps = [step_defs.decode_step(TINY, b, 29) for b in (1, 2, 3, 5)]
    wide = [1.0, 1.12, 1.03, 1.09, 1.06, 1.08]  # alone: its extremes hold 1.0, no effect
    rows = [_row(steps[0], "layer", wide)] + [_row(s, "layer", 1.05 + 0.01 * RNG.random(6)) for s in steps[1:3]]
    rows.append(_row(steps[3], "layer", [1.5, 1.52, 1.49, 1.51, 1.5, 1.53]))  # another effect: kept out of the pool
    table = seq.decisions(pd.DataFrame(rows))
    own = median_interval(wide)
    assert own.low <= 1.0 and table["pooled_shapes"].tolist() == [3, 3, 3, 0]
    assert table["basis"].iloc[0] == "pooled over 3 shapes" and table["applied"].iloc[0]
    pooled = median_interval([v for r in rows[:3] for v in seq._effects(r["turn_effects"])])
    assert table["applied_effect"].iloc[0] == pooled.median and table["applied_low"].iloc[0] == pooled.low
    assert table["basis"].iloc[3] == "its own 6 turns" and table["applied_effect"].iloc[3] == pytest.approx(1.505)
    # a noisy row joins no pool and is never applied; the head's rows pool apart from the layers'
    noisy = seq.decisions(pd.DataFrame(rows[:3] + [_row(steps[3], "layer", [1.5] * 6, noisy=True),
                                                   _row(steps[1], "head", [1.2] * 6)]))
    assert noisy["pooled_shapes"].tolist() == [3, 3, 3, 0, 0] and not noisy["applied"].iloc[3]
    assert noisy["why"].iloc[3].startswith("noisy")


def test_shapes_of_two_effects_do_not_pool_into_one_narrow_interval():
    # two low shapes (1.00-1.04), one between (1.02-1.07), two high ones (1.05-1.09): the middle one meets both ends,
    # but they do not meet each other, so it keeps its own turns; each end pools with its pair and the middle one
    low = [1.0, 1.01, 1.02, 1.02, 1.03, 1.04]
    middle = [1.02, 1.03, 1.04, 1.05, 1.06, 1.07]
    high = [1.05, 1.06, 1.07, 1.07, 1.08, 1.09]
    effects = [low, low[::-1], middle, high, high[::-1]]
    steps = [step_defs.decode_step(TINY, b, 29) for b in (1, 2, 3, 5, 7)]
    table = seq.decisions(pd.DataFrame([_row(s, "layer", e) for s, e in zip(steps, effects, strict=True)]))
    everything = median_interval([v for e in effects for v in e])
    assert everything.high - everything.low < 1.07 - 1.02  # the pool the middle shape would take is narrower
    assert table["basis"].iloc[2] == "its own 6 turns" and table["applied_low"].iloc[2] == 1.02
    assert table["basis"].iloc[0] == "pooled over 3 shapes" and table["basis"].iloc[4] == "pooled over 3 shapes"


def test_composed_figures_carry_the_sum_of_their_rows_intervals():
    step = step_defs.decode_step(TINY, 3, 29)
    m = _measured([step], [], sigma=0.1)
    t = pm.tpot(m, TINY, 3, 29)
    # each distinct row once, its count multiplying its arm (the same measurement read count times)
    arms = [u.count * 0.1 * power_latency(u) for u in step]
    assert t.total_ms == hand_tpot(3, 29)
    assert t.low_ms == pytest.approx(t.total_ms - math.sqrt(sum(a * a for a in arms)))
    assert t.high_ms == pytest.approx(t.total_ms + math.sqrt(sum(a * a for a in arms)))
    layer = t.layer_interval(TINY.layers)
    body = [u for u in step if u.part != "head"]
    assert layer[0] == pytest.approx(sum(u.count * power_latency(u) for u in body) / TINY.layers)
    assert layer[2] - layer[0] == pytest.approx(math.sqrt(sum((u.count * 0.1 * power_latency(u)) ** 2
                                                              for u in body)) / TINY.layers)
    sweep = pm.batch_sweep(m, TINY, [3], 29).iloc[0]
    assert (sweep["tpot_low_ms"], sweep["tpot_high_ms"]) == (t.low_ms, t.high_ms)
    assert sweep["tokens_per_s_low"] == pytest.approx(3e3 / t.high_ms)
    # a row without an interval leaves the sum without one: unknown, never narrow
    rows = op_rows(step_defs.distinct_uses([step]), power_latency)
    assert math.isnan(pm.tpot(pm.Measured(rows, model="tiny", dtype="float32"), TINY, 3, 29).low_ms)


def test_a_row_of_an_older_file_takes_its_interval_from_its_raw_samples():
    step = step_defs.decode_step(TINY, 1, 9)
    rows = op_rows(step_defs.distinct_uses([step]), power_latency)
    draws = [list(v * (1 + 0.05 * RNG.standard_normal(11))) for v in rows["latency_ms"]]
    low, high = pm.row_intervals(rows.assign(samples_ms=draws))
    assert low.tolist() == [median_interval(d).low for d in draws]
    assert high.tolist() == [median_interval(d).high for d in draws]


def test_a_sum_of_independent_medians_adds_arms_in_quadrature_and_a_negative_count_swaps_them():
    value, low, high = sum_interval([(2, (10.0, 9.0, 12.0)), (-1, (4.0, 3.0, 4.5))])
    assert value == 16.0
    assert low == pytest.approx(16 - math.hypot(2 * 1.0, 0.5)) and high == pytest.approx(16 + math.hypot(2 * 2.0, 1.0))
    assert math.isnan(sum_interval([(1, (1.0, math.nan, 2.0))])[1])


def test_tpot_below_a_smaller_batch_beyond_both_intervals_is_named_with_the_op_that_got_faster():
    # the gate_up GEMM at M = 4 slower than at M = 8 (a slow BLAS shape): TPOT(8) < TPOT(4) beyond their intervals
    def latency(use):
        slow = use.field_dict.get("projection") == "gate_up" and use.field_dict.get("m") == 4
        return power_latency(use) * (10 if slow else 1)

    steps = [step_defs.decode_step(TINY, b, 29) for b in (2, 4, 8)]
    rows = op_rows(step_defs.distinct_uses(steps), latency)
    rows["latency_ci_low_ms"], rows["latency_ci_high_ms"] = rows["latency_ms"] * 0.98, rows["latency_ms"] * 1.02
    table = pm.batch_sweep(pm.Measured(rows, model="tiny", dtype="float32"), TINY, (2, 4, 8), 29)
    assert table["monotone_note"].tolist()[:2] == ["", ""]
    assert table["monotone_note"].iloc[2].startswith("below batch 4's TPOT") and "gate_up" in table[
        "monotone_note"].iloc[2]
    # the same points with intervals wide enough to overlap: within their noise, no note
    rows["latency_ci_low_ms"], rows["latency_ci_high_ms"] = rows["latency_ms"] * 0.2, rows["latency_ms"] * 3
    wide = pm.batch_sweep(pm.Measured(rows, model="tiny", dtype="float32"), TINY, (2, 4, 8), 29)
    assert wide["monotone_note"].tolist() == ["", "", ""]
