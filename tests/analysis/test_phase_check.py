"""The phase check: one layer per round against (t(2L) - t(0)) / 2L of the passes around it, the published
composition with the measured zero-layer pass, intervals over rounds and brackets, verdicts and their counts."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from phasebench.analysis import load_phases, phases_summary
from phasebench.analysis.loading.results import load
from phasebench.analysis.phases import model as pm
from phasebench.analysis.phases.check import (
    COLUMNS,
    GOAL_PCT,
    ReferencePlan,
    check_sentence,
    check_table,
    goal_pct,
    iteration_costs,
    plan_of,
    verdict_counts,
    verdict_notes,
)
from phasebench.analysis.report import headline
from phasebench.bench.spec import steps as step_defs

from ..conftest import REPO
from .phase_rows import TINY, op_rows

PLAN = ReferencePlan(TINY, 2, "cpu", "float32", prompt=64, batches=(1, 8), context=48)
SAMPLE = REPO / "analysis" / "sample" / "cpu-phases"


def _latencies(seed: int) -> dict:
    """A fresh seeded latency (ms) per op the plan composes, never zero, between 0.05 and 2.05."""
    rng = np.random.default_rng(seed)
    return {(u.op, u.fields): 0.05 + 2.0 * float(rng.random()) for u in PLAN.uses()}


def _measured(latency: dict, scale: float = 1.0) -> pm.Measured:
    """The rows of every op the plan composes, each with a 95% interval of -3% / +4% about its latency."""
    rows = op_rows(PLAN.uses(), lambda use: scale * latency[use.op, use.fields])
    rows = rows.assign(latency_ci_low_ms=0.97 * rows["latency_ms"], latency_ci_high_ms=1.04 * rows["latency_ms"])
    return pm.Measured(rows, model=TINY.name, dtype="float32")


def _layer_and_head(latency: dict, phase: str, batch: int, tokens: int) -> tuple[float, float]:
    """(one layer, the head) of a scenario's composition summed by hand in float64 from the step's uses."""
    one = PLAN.cut(1)
    step = step_defs.prefill_step(one, tokens) if phase == "prefill" else step_defs.decode_step(one, batch, tokens)
    layer, head = np.float64(0.0), np.float64(0.0)
    for use in step:
        ms = np.float64(use.count) * np.float64(latency[use.op, use.fields])
        if use.part == "head":
            head += ms
        else:
            layer += ms
    return float(layer), float(head)


def _brackets(latency: dict, *, layer_scale=1.0, fixed=0.3, drift=(), noise=0.0, seed=0, kind="phasebench",
              rounds=5) -> list[dict]:
    """The real passes of every scenario at 0, L and 2L layers in rounds + 1 brackets: the composed head plus `fixed`
    ms (the per-iteration work), and layer_scale x the composed layer per layer; bracket k slowed by drift[k] on
    every depth alike, and each pass by a seeded lognormal `noise`."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(rounds + 1):
        slow = drift[k] if drift else 1.0
        for phase, batch, tokens in PLAN.scenarios:
            layer, head = _layer_and_head(latency, phase, batch, tokens)
            for depth in PLAN.depths:
                ms = slow * (head + fixed + layer_scale * layer * depth) * float(np.exp(noise * rng.standard_normal()))
                out.append({"reference": kind, "implementation": f"{kind} decoder", "bracket": k, "phase": phase,
                            "batch": batch, "tokens": tokens, "layers": depth, "ms": ms, "samples_ms": [ms]})
    return out


def test_one_layer_and_the_step_come_out_exact_and_the_head_and_fixed_cost_cancel():
    latency = _latencies(3)
    brackets = _brackets(latency, layer_scale=1.25, fixed=0.7)
    table, details = check_table(brackets, PLAN, published=_measured(latency), per_round=[_measured(latency)] * 5)
    assert list(table.columns) == list(COLUMNS) and len(COLUMNS) < 20
    for row, detail in zip(table.to_dict("records"), details.to_dict("records"), strict=True):
        layer, head = _layer_and_head(latency, row["phase"], row["batch"], row["tokens"])
        # a real layer is 1.25 x the composed one: the composition is 20% fast, whatever the head and fixed cost
        assert row["per_layer_error_pct"] == pytest.approx(-20.0, abs=1e-9)
        assert detail["per_layer_reference_ms"] == pytest.approx(1.25 * layer, rel=1e-12)
        assert detail["iteration_ms"] == pytest.approx(0.7, rel=1e-9)  # the zero-layer pass less the composed head
        assert row["composed_ms"] == pytest.approx(2 * layer + head + 0.7, rel=1e-12)
        assert row["reference_ms"] == pytest.approx(head + 0.7 + 2.5 * layer, rel=1e-12)
        assert row["error_pct"] == pytest.approx(100 * ((2 * layer + head + 0.7) / (head + 0.7 + 2.5 * layer) - 1))
        assert detail["head_share_pct"] == pytest.approx(100 * head / row["composed_ms"])
        # the published rows are the check's here: their one layer reads the same
        assert row["published_per_layer_error_pct"] == pytest.approx(-20.0, abs=1e-9)
        assert detail["rounds"] == 5 and detail["brackets"] == 6 and row["verdict"] == "over"


def test_a_drift_that_moves_both_sides_alike_cancels_round_by_round():
    latency = _latencies(5)
    drift = (1.0, 1.1, 1.25, 1.4, 1.5, 1.6)  # the machine slows 60% over the check
    per_round = [_measured(latency, np.sqrt(drift[k] * drift[k + 1])) for k in range(5)]
    table, details = check_table(_brackets(latency, drift=drift, fixed=0.0), PLAN, published=_measured(latency),
                                 per_round=per_round)
    assert np.allclose(table["per_layer_error_pct"], 0.0, atol=1e-9)
    assert (table["per_layer_error_high_pct"] - table["per_layer_error_low_pct"] < 1.0).all()  # the floor's width
    assert np.allclose(details["drift_pct"], 60.0)
    # the ops measured at the start of the run (no drift) against passes averaged over it: the published error says so
    assert (table["error_pct"] < -15).all()


def test_a_composition_20_percent_wrong_per_layer_is_called_over_at_realistic_widths():
    """Passes with 2% lognormal noise each (a 2-core host's bracket medians of 5 samples or more) and ops rounds with
    2%: the per-layer error's interval stays inside ±10% of its point and the verdict is over; the right composition
    is within."""
    latency = _latencies(11)
    rng = np.random.default_rng(12)
    per_round = [_measured(latency, float(np.exp(0.02 * rng.standard_normal()))) for _ in range(5)]
    wrong, _ = check_table(_brackets(latency, layer_scale=1.25, noise=0.02, seed=13), PLAN,
                           published=_measured(latency), per_round=per_round)
    assert (wrong["per_layer_error_high_pct"] - wrong["per_layer_error_low_pct"] < 20).all()
    assert (wrong["per_layer_error_high_pct"] < -15).all() and (wrong["verdict"] == "over").all()
    right, _ = check_table(_brackets(latency, noise=0.02, seed=13, fixed=0.0), PLAN, published=_measured(latency),
                           per_round=per_round)
    assert (right["per_layer_error_low_pct"] > -15).all() and (right["per_layer_error_high_pct"] < 15).all()


def test_at_the_hosts_own_spread_five_rounds_leave_a_20_percent_error_unresolved():
    """The committed llama-3-8b sample's rounds spread by 7-15% per round in their per-layer ratio (its passes' brackets
    by 5-10%): with 8% per pass and per op round, the interval over 5 rounds is too wide to call a 20% error over on
    most rows. Power on this host needs more rounds (docs/phases.md: what the verdict can resolve)."""
    latency = _latencies(11)
    rng = np.random.default_rng(21)
    per_round = [_measured(latency, float(np.exp(0.08 * rng.standard_normal()))) for _ in range(5)]
    table, _ = check_table(_brackets(latency, layer_scale=1.25, noise=0.08, seed=22), PLAN,
                           published=_measured(latency), per_round=per_round)
    widths = table["per_layer_error_high_pct"] - table["per_layer_error_low_pct"]
    assert (widths > 20).all() and (table["verdict"] != "over").sum() >= 2


def test_a_row_without_its_per_layer_rounds_is_never_within():
    latency = _latencies(8)
    table, _ = check_table(_brackets(latency, fixed=20.0), PLAN, published=_measured(latency), per_round=[])
    assert (table["verdict"] == "unresolved").all() and table["per_layer_error_pct"].isna().all()


def test_an_unbuilt_reference_says_why_and_judges_nothing():
    latency = _latencies(7)
    unbuilt = [{"reference": "transformers", "bracket": k, "phase": "prefill", "batch": 1, "tokens": 64,
                "layers": d, "error": "no transformers"} for k in range(2) for d in PLAN.depths]
    table, _ = check_table(unbuilt, PLAN, published=_measured(latency), per_round=[_measured(latency)] * 2)
    row = table.iloc[0]
    assert row["error"] == "no transformers" and row["verdict"] == "unresolved" and np.isnan(row["reference_ms"])
    assert verdict_counts(table) == {"within": 0, "over": 0, "unresolved": 1, "unresolved_share": 1.0}


def test_each_published_steps_iteration_cost_is_its_zero_layer_pass_less_its_composed_head():
    latency = _latencies(9)
    plan = ReferencePlan(TINY, 2, "cpu", "float32", prompt=64, batches=(1, 8), context=48,
                         iteration_scenarios=(("decode", 3, 48), ("prefill", 1, 64)))
    assert plan.zero_layer_only == [("decode", 3, 48)]
    rows = op_rows(step_defs.distinct_uses([plan.uses(), step_defs.decode_step(plan.cut(), 3, 48)]),
                   lambda use: latency.get((use.op, use.fields), 0.4))
    rows = rows.assign(latency_ci_low_ms=0.97 * rows["latency_ms"], latency_ci_high_ms=1.04 * rows["latency_ms"])
    measured = pm.Measured(rows, model=TINY.name, dtype="float32")
    head3 = pm.tpot(measured, plan.cut(), 3, 48).parts["head"]
    brackets = [{"reference": "phasebench", "bracket": k, "phase": "decode", "batch": 3, "tokens": 48, "layers": 0,
                 "ms": head3 + 0.25 + 0.01 * k, "samples_ms": [1.0]} for k in range(4)]
    costs = iteration_costs(brackets, plan, measured)
    assert list(costs) == [("decode", 3, 48)]  # the scenarios without a zero-layer pass: none
    ms, low, high = costs[("decode", 3, 48)]
    geometric = float(np.exp(np.mean(np.log([head3 + 0.25 + 0.01 * k for k in range(4)]))))
    assert ms == pytest.approx(geometric - head3, rel=1e-9) and low < ms < high
    # the prefill and decode tables take it as a part of its own, once, whatever the layer count; the other tables
    # (chunked, co-located, speculative) compose ops only, on both sides of their ratios
    priced = pm.Measured(rows, model=TINY.name, dtype="float32", iterations=costs)
    for layers in (2, 3):
        sweep = pm.batch_sweep(priced, plan.cut(layers), (3, 8), 48).set_index("batch")
        plain = pm.batch_sweep(measured, plan.cut(layers), (3, 8), 48).set_index("batch")
        assert sweep.loc[3, "iteration_ms"] == ms and sweep.loc[3, "tpot_ms"] == pytest.approx(plain.loc[3, "tpot_ms"]
                                                                                               + ms)
        assert sweep.loc[8, "tpot_ms"] == plain.loc[8, "tpot_ms"]  # no zero-layer pass of its own: none added
    assert pm.tpot(priced, plan.cut(), 3, 48).total_ms == pm.tpot(measured, plan.cut(), 3, 48).total_ms


def test_the_goal_is_the_hosts_on_the_host_and_the_gpus_on_any_accelerator():
    assert goal_pct("cpu") == 15.0 and goal_pct("cuda") == goal_pct("cuda:1") == GOAL_PCT["cuda"] == 10.0
    latency = _latencies(4)
    for device, expected in (("cpu", "within"), ("cuda:0", "over")):  # a layer 12% slower than composed
        plan = ReferencePlan(TINY, 2, device, "float32", prompt=64, batches=(1, 8), context=48)
        brackets = _brackets(latency, layer_scale=1 / 0.88, fixed=0.0)
        table, _ = check_table(brackets, plan, published=_measured(latency), per_round=[_measured(latency)] * 5)
        assert np.allclose(table["per_layer_error_pct"], -12.0)
        assert set(table["verdict"]) == {expected}


def test_verdicts_are_said_beside_the_tables_in_the_summary_and_the_headline():
    latency = _latencies(6)
    brackets = _brackets(latency, layer_scale=1.25, fixed=0.0)
    table, _ = check_table(brackets, PLAN, published=_measured(latency), per_round=[_measured(latency)] * 5)
    notes = verdict_notes(table, "over")
    assert len(notes) == 3 and notes[1].startswith("phasebench decode batch 1: error -")
    assert "check's per layer -20.0% [" in notes[1] and notes[1].endswith(": over the 15% goal")
    sentence = check_sentence(table, "decode")
    assert sentence.startswith("Checked against real passes (goal 15%; < 0: the composition is faster")
    assert "phasebench (2 layers) decode batch 1 " in sentence and "check's per layer -20.0% [" in sentence
    assert "(published per layer -20.0%" in sentence
    assert "OVER GOAL" in sentence and "batch 8 " in sentence
    assert check_sentence(table, "verify") == ""


def test_plan_of_reads_back_the_check_a_phases_json_describes():
    meta = {"model": {**TINY.__dict__}, "reference_layers": 2, "device": "cpu", "dtype": "float32",
            "chunk_prompt": 64, "reference_batches": [1, 8], "context": 48, "impls": {"attention": "flash"}}
    plan = plan_of(meta)
    assert plan.depths == (0, 2, 4) and plan.scenarios == PLAN.scenarios and plan.model == TINY


@pytest.mark.skipif(not (SAMPLE / "reference_details.csv").is_file(), reason="the sample predates the check's rounds")
def test_the_committed_sample_publishes_the_composition_of_its_own_ops_and_zero_layer_passes():
    """The published error is that of the figures the sample's tables show: recomposed here from its ops/ rows and
    its zero-layer passes against the same reference times, every row."""
    tables = load_phases(SAMPLE)
    meta, reference = tables["meta"], tables["reference"]
    details = pd.read_csv(SAMPLE / "reference_details.csv")
    plan = plan_of(meta)
    measured = pm.Measured(load(SAMPLE / "ops"), model=plan.model.name, dtype=plan.dtype, impls=meta["impls"])
    assert list(reference.columns) == list(COLUMNS) and len(reference) == len(details)
    for row, detail in zip(reference.to_dict("records"), details.to_dict("records"), strict=True):
        step = plan.composed(measured, row["phase"], int(row["batch"]), int(row["tokens"]))
        body = step.total_ms - step.parts["head"]
        assert row["composed_ms"] == pytest.approx(body + detail["zero_layer_ms"], rel=1e-9)
        assert row["error_pct"] == pytest.approx(pm.model_error(row["composed_ms"], row["reference_ms"]), rel=1e-9)
    counts = verdict_counts(reference)
    assert meta["check_verdicts"] == pytest.approx(counts)
    assert "Composition against a real forward pass" in phases_summary(tables)
    assert "Checked against real passes" in headline(None, tables).markdown()
