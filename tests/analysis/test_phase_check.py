"""The phase check: the published composition's error from the ops/ rows beside the interleaved rounds', the
per-layer error from references of L and 2L layers (the head removed exactly), the goal, and folders of every age."""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pandas as pd
import pytest
from phasebench.analysis import load_phases, phases_summary
from phasebench.analysis.loading.results import load
from phasebench.analysis.phases import model as pm
from phasebench.analysis.phases.check import (
    GOAL_PCT,
    ReferencePlan,
    check_sentence,
    check_table,
    goal_pct,
    normalised,
    over_goal_notes,
    pct_interval,
    plan_of,
    verdict_notes,
)
from phasebench.analysis.report import headline

from ..conftest import REPO
from .phase_rows import TINY, op_rows

PLAN = ReferencePlan(TINY, 2, "cpu", "float32", prompt=64, batches=(1, 8), context=48)
SAMPLE = REPO / "analysis" / "sample" / "cpu-phases"


def _latencies(seed: int) -> dict:
    """A fresh seeded latency (ms) per op the plan composes, never zero, between 0.05 and 2.05."""
    rng = np.random.default_rng(seed)
    return {(u.op, u.fields): 0.05 + 2.0 * float(rng.random()) for u in PLAN.uses()}


def _rows(latency: dict, scale: float = 1.0) -> pd.DataFrame:
    return op_rows(PLAN.uses(), lambda use: scale * latency[use.op, use.fields])


def _measured(rows: pd.DataFrame) -> pm.Measured:
    return pm.Measured(rows, model=TINY.name, dtype="float32")


def _bracket(k, phase, batch, tokens, layers, ms, kind="phasebench"):
    return {"reference": kind, "implementation": f"{kind} decoder", "bracket": k, "phase": phase, "batch": batch,
            "tokens": tokens, "layers": layers, "ms": ms, "samples_ms": [ms], "noisy": False, "noise_reason": ""}


def _layer_and_head(latency: dict, phase: str, batch: int, tokens: int) -> tuple[float, float]:
    """(one layer, the head) of a scenario's composition summed by hand in float64 from the step's uses."""
    from phasebench.bench.spec import steps as step_defs

    one = PLAN.cut(1)
    step = (step_defs.prefill_step(one, tokens) if phase == "prefill" else step_defs.decode_step(one, batch, tokens))
    layer = np.float64(0.0)
    head = np.float64(0.0)
    for use in step:
        ms = np.float64(use.count) * np.float64(latency[use.op, use.fields])
        if use.part == "head":
            head += ms
        else:
            layer += ms
    return float(layer), float(head)


def _latency(use) -> float:
    f = use.field_dict
    return 0.01 * (f.get("m") or f["batch"] * f["q_len"]) + 0.001 * f.get("kv_len", 0)


def test_the_rounds_are_compared_with_their_brackets_so_a_shared_drift_cancels():
    plan = ReferencePlan(TINY, 2, "cpu", "float32", prompt=64, batches=(1, 8), context=48)
    small = dataclasses.replace(TINY, layers=2)
    scale = (1.0, 1.2, 1.4)  # the machine slows 40% over the rounds of the ops

    def rows(k):
        return op_rows(plan.uses(), lambda use: _latency(use) * scale[k])

    per_round = [pm.Measured(rows(k), model=TINY.name, dtype="float32") for k in range(3)]
    measured = pm.Measured(pd.concat([rows(k) for k in range(3)]), model=TINY.name, dtype="float32")
    composed = {(p, b): plan.composed(per_round[0], p, b, t).total_ms for p, b, t in plan.scenarios}
    # the reference slows alike between its brackets: every round agrees, the row is quiet
    moves = {("prefill", 1): (1.0, 1.1, 1.3, 1.5),
             ("decode", 1): (1.0, 1.0, 1.0, 1.0),  # the ops moved, the reference did not: the rounds disagree
             ("decode", 8): (1.0, 1.1, 1.3, 1.5)}
    brackets = [{"reference": "phasebench", "implementation": "ours", "bracket": k, "phase": p, "batch": b,
                 "tokens": t, "ms": composed[p, b] * moves[p, b][k], "samples_ms": [composed[p, b] * moves[p, b][k]],
                 "noisy": (p, b) == ("decode", 8) and k > 0, "noise_reason": "busy host"}
                for k in range(4) for p, b, t in plan.scenarios]
    table = check_table(brackets, plan, published=measured, interleaved=measured,
                        per_round=per_round).set_index(["phase", "batch"])
    assert list(table.index) == [("prefill", 1), ("decode", 1), ("decode", 8)]
    prefill = table.loc[("prefill", 1)]
    assert prefill["reference_ms"] == pytest.approx(1.2 * composed["prefill", 1])  # median of the 4 brackets
    # each op's median over the 3 rounds
    assert prefill["interleaved_composed_ms"] == pytest.approx(1.2 * composed["prefill", 1])
    assert prefill["interleaved_error_pct"] == pytest.approx(0.0, abs=1e-9)
    assert prefill["drift_pct"] == pytest.approx(50.0)
    assert prefill["round_error_min_pct"] == pytest.approx(100 * (1 / 1.05 - 1)) and prefill["round_error_max_pct"] \
        == pytest.approx(0.0, abs=1e-9)
    assert not prefill["noisy"] and prefill["samples"] == 4 and prefill["brackets"] == 4 and prefill["rounds"] == 3
    decode1 = table.loc[("decode", 1)]
    assert decode1["noisy"] and decode1["noise_reason"] == ("the rounds disagree: errors +0% to +40%, interquartile "
                                                            "range 20 points")
    assert decode1["interleaved_composed_ms"] == pytest.approx(pm.tpot(measured, small, 1, 48).total_ms)
    assert decode1["interleaved_error_pct"] == pytest.approx(20.0)
    decode8 = table.loc[("decode", 8)]
    assert decode8["noisy"] and decode8["noise_reason"].startswith("busy in 3 of 4 timings (busy host)")
    for row in (decode1, decode8):  # a noisy row gives no verdict beyond unresolved, whatever its errors read
        assert row["verdict"] == row["published_verdict"] == row["per_layer_verdict"] == "unresolved"
    assert decode8["interleaved_error_pct"] == pytest.approx(0.0, abs=1e-9)
    unbuilt = [{"reference": "transformers", "bracket": k, "phase": "prefill", "batch": 1, "tokens": 64,
                "error": "no transformers"} for k in range(2)]
    row = check_table(unbuilt, plan, published=measured, interleaved=measured, per_round=per_round).iloc[0]
    assert pd.isna(row["reference_ms"]) and row["error"] == "no transformers" and not row["noisy"]
    assert row["brackets"] == 0 and pd.isna(row["interleaved_error_pct"])



def test_the_published_error_is_the_ops_rows_and_the_interleaved_one_the_rounds():
    """ops/ read 12% slower than the rounds: the published figure's error is not the rounds' error."""
    latency = _latencies(3)
    published, rounds = _rows(latency, 1.12), [_rows(latency, s) for s in (0.98, 1.0, 1.02)]
    interleaved = _measured(pd.concat(rounds))
    brackets = []
    for phase, batch, tokens in PLAN.scenarios:
        layer, head = _layer_and_head(latency, phase, batch, tokens)
        for k in range(4):  # the reference equals the rounds' median composition, at L and 2L layers
            brackets += [_bracket(k, phase, batch, tokens, depth, depth * layer + head) for depth in PLAN.depths]
    table = check_table(brackets, PLAN, published=_measured(published), interleaved=interleaved,
                        per_round=[_measured(r) for r in rounds]).set_index(["phase", "batch"])
    assert list(table.index) == [("prefill", 1), ("decode", 1), ("decode", 8)]
    for _, row in table.iterrows():
        assert row["interleaved_error_pct"] == pytest.approx(0.0, abs=1e-9)
        assert row["published_error_pct"] == pytest.approx(12.0, rel=1e-9)
        assert row["published_composed_ms"] == pytest.approx(1.12 * row["interleaved_composed_ms"], rel=1e-12)
        assert row["per_layer_error_pct"] == pytest.approx(12.0, rel=1e-9)
        assert row["per_layer_interleaved_error_pct"] == pytest.approx(0.0, abs=1e-9)
        assert row["round_error_min_pct"] == pytest.approx(-2.0) and row["round_error_max_pct"] == pytest.approx(2.0)
        assert row["layers"] == 2 and row["deep_layers"] == 4 and not row["noisy"] and row["rounds"] == 3
        # within the host's 15% goal
        assert row["goal_pct"] == GOAL_PCT["cpu"] and not row["over_goal"]


def test_the_per_layer_error_from_l_and_2l_references_removes_the_head_exactly():
    latency = _latencies(11)
    brackets, expected = [], {}
    rng = np.random.default_rng(12)
    for phase, batch, tokens in PLAN.scenarios:
        layer, head = _layer_and_head(latency, phase, batch, tokens)
        real_layer = layer * (1.0 + 0.4 * float(rng.random()) + 0.05)  # the real layer slower by 5-45%
        real_head = head * 7.0  # a head far off the composition's: it must not leak into the per-layer error
        for k in range(3):
            brackets += [_bracket(k, phase, batch, tokens, d, d * real_layer + real_head) for d in PLAN.depths]
        expected[phase, batch] = (layer, head, real_layer, real_head)
    table = check_table(brackets, PLAN, published=_measured(_rows(latency))).set_index(["phase", "batch"])
    for key, (layer, head, real_layer, real_head) in expected.items():
        row = table.loc[key]
        assert row["per_layer_reference_ms"] == pytest.approx(real_layer, rel=1e-12)
        assert row["per_layer_composed_ms"] == pytest.approx(layer, rel=1e-12)
        assert row["per_layer_error_pct"] == pytest.approx(100 * (layer - real_layer) / real_layer, rel=1e-12)
        whole, real = 2 * layer + head, 2 * real_layer + real_head
        assert row["published_error_pct"] == pytest.approx(100 * (whole - real) / real, rel=1e-12)
        assert row["head_share_pct"] == pytest.approx(100 * head / whole, rel=1e-12)
        assert row["deep_reference_ms"] == pytest.approx(4 * real_layer + real_head, rel=1e-12)
        assert np.isnan(row["interleaved_error_pct"]) and row["rounds"] == 0
        # one sample per bracket and rows without intervals: no noise band, so no verdict
        assert row["verdict"] == "unresolved" and not row["over_goal"]


def test_brackets_that_disagree_on_the_layer_make_the_row_noisy():
    latency = _latencies(5)
    layer, head = _layer_and_head(latency, "decode", 1, 48)
    brackets = []
    for k, stretch in enumerate((1.0, 1.0, 1.6, 1.6)):  # the 2L pass slows by 60% in half the brackets
        brackets += [_bracket(k, "decode", 1, 48, 2, 2 * layer + head),
                     _bracket(k, "decode", 1, 48, 4, stretch * (4 * layer + head))]
    row = check_table(brackets, PLAN, published=_measured(_rows(latency))).iloc[0]
    assert row["noisy"] and "per-layer errors disagree" in row["noise_reason"]
    # the brackets' own errors, kept for the verdict of a noisy row: the L pass agrees with the composition in every
    # bracket; the slowed 2L pass makes the per-layer error 0 in half the brackets, below it in the other half
    assert row["published_bracket_min_pct"] == pytest.approx(0.0, abs=1e-9) == row["published_bracket_max_pct"]
    assert row["per_layer_bracket_max_pct"] == pytest.approx(0.0, abs=1e-9)
    assert row["per_layer_bracket_min_pct"] == pytest.approx(100 * (layer / (2.2 * layer + 0.3 * head) - 1))


@pytest.mark.parametrize("stretches,busy,expected", [
    ((1.3, 1.3, 1.9, 1.9), False, "over"),  # the brackets disagree, but every one is past the goal: over stands
    ((1.05, 1.3, 1.9, 1.9), False, "unresolved"),  # one bracket inside the goal
    ((1.3, 1.3, 1.9, 1.9), True, "unresolved"),  # a busy machine slows every bracket alike: no verdict at all
])
def test_a_noisy_row_is_over_only_where_every_bracket_is_past_the_goal(stretches, busy, expected):
    latency = _latencies(23)
    layer, head = _layer_and_head(latency, "decode", 1, 48)
    rows = _rows(latency)
    rows["latency_ci_low_ms"], rows["latency_ci_high_ms"] = rows["latency_ms"] * 0.995, rows["latency_ms"] * 1.005
    brackets = []
    for k, stretch in enumerate(stretches):  # the real layers 5-90% slower than the composed ones, bracket by bracket
        for depth in PLAN.depths:
            ms = depth * layer * stretch + head
            brackets.append({**_bracket(k, "decode", 1, 48, depth, ms), "samples_ms": [ms * 0.998, ms, ms * 1.002],
                             "noisy": busy, "noise_reason": "busy host" if busy else ""})
    row = check_table(brackets, PLAN, published=_measured(rows)).iloc[0]
    assert row["noisy"] and row["published_bracket_max_pct"] < 0
    assert row["published_verdict"] == row["verdict"] == expected
    assert normalised(pd.DataFrame([row]), "cpu").iloc[0]["verdict"] == expected  # read back: the same verdict


def test_a_figure_beyond_the_goal_is_flagged_in_the_summary_the_headline_and_the_report(tmp_path):
    from phasebench.analysis import load, write_report

    tables = load_phases(SAMPLE)
    reference = tables["reference"].copy()
    prefill, decode = reference["phase"] == "prefill", reference["phase"] == "decode"
    columns = ["published_error_pct", "published_error_low_pct", "published_error_high_pct", "interleaved_error_pct",
               "per_layer_error_pct", "per_layer_error_low_pct", "per_layer_error_high_pct"]
    # prefill: +14.7% whose interval straddles the goal (unresolved); decode: a per-layer error wholly beyond it
    reference.loc[prefill, columns] = [14.7, 10.0, 19.0, 1.1, 3.0, 1.0, 5.0]
    reference.loc[decode, columns] = [1.5, -1.0, 4.0, -3.2, -21.0, -25.0, -18.0]
    reference["noisy"] = False  # quiet rows: a noisy one gives no verdict beyond unresolved
    tables["reference"] = normalised(reference, "cpu")  # the decode rows' per-layer error as the issue measured it
    assert tables["reference"]["verdict"].tolist() == ["unresolved", "over", "over"] * 2
    summary = phases_summary(tables)
    decode_lines = summary.split("Decode at context")[1].split("Chunked prefill")[0]
    assert "per layer -21.0% [-25.0%, -18.0%]" in decode_lines and "OVER GOAL" in decode_lines  # beside TPOT
    prefill_lines = summary.split("Prefill (one prompt")[1].split("Decode at context")[0]
    assert "OVER GOAL" not in prefill_lines and "published +14.7% [+10.0%, +19.0%]" in prefill_lines
    assert "unresolved" in prefill_lines
    text = headline(None, tables).markdown()
    assert ("decode batch 1 published +1.5% [-1.0%, +4.0%] (interleaved -3.2%, per layer -21.0% [-25.0%, -18.0%])"
            in text and "OVER GOAL" in text)
    tables["sequences"] = pd.DataFrame([{"key": "3f2a", "sequence": "layer", "phase": "decode", "m": 8, "ops": 12,
                                         "sequence_ms": 41.5, "alone_ms": 40.25, "term_ms": 1.25, "status": "ok"}])
    page = write_report(load(SAMPLE / "ops"), tmp_path, phases=tables)["html"].read_text(encoding="utf-8")
    phases = page.split('id="phases"')[1]
    assert '<p class="over-goal">Checked against real passes' in phases and "OVER GOAL" in phases
    assert "The ops in sequence against alone" in phases and "41.5" in phases
    notes = over_goal_notes(tables["reference"])
    assert len(notes) == 4 and notes[0] == ("phasebench decode batch 1: per-layer error -21.0% [-25.0%, -18.0%], "
                                            "over the 15% goal")
    unresolved = verdict_notes(tables["reference"], "unresolved")
    assert len(unresolved) == 2 and "published error +14.7% [+10.0%, +19.0%], unresolved against" in unresolved[0]


def test_the_goal_is_the_hosts_on_the_host_and_the_gpus_on_any_accelerator():
    assert goal_pct("cpu") == 15.0 and goal_pct("cuda") == goal_pct("cuda:1") == GOAL_PCT["cuda"] == 10.0
    row = pd.DataFrame([{"phase": "decode", "batch": 16, "layers": 4, "published_error_pct": -12.0,
                         "published_error_low_pct": -13.0, "published_error_high_pct": -11.0,
                         "per_layer_error_pct": -9.0, "per_layer_error_low_pct": -9.5, "per_layer_error_high_pct": -8.5,
                         "reference_ms": 1.0, "left_out": ""}])
    assert normalised(row, "cuda:0")["verdict"].item() == "over" and normalised(row, "cuda:0")["over_goal"].item()
    assert normalised(row, "cpu")["verdict"].item() == "within" and not normalised(row, "cpu")["over_goal"].item()
    for noisy in (True, "True"):  # read back from a table (CSV text) or built: a noisy row gives no verdict
        again = normalised(row.assign(noisy=noisy), "cuda:0")
        assert (again[["published_verdict", "per_layer_verdict", "verdict"]] == "unresolved").all(axis=None)
    # noisy, but every bracket's error past the goal on the fast side: over stands; one bracket inside it: unresolved
    past = row.assign(noisy=True, published_bracket_min_pct=-19.0, published_bracket_max_pct=-10.5,
                      per_layer_bracket_min_pct=-14.0, per_layer_bracket_max_pct=-4.0)
    judged = normalised(past, "cuda:0").iloc[0]
    assert judged["published_verdict"] == "over" and judged["per_layer_verdict"] == "unresolved"
    assert judged["verdict"] == "over" and judged["over_goal"]
    assert normalised(past, "cpu").iloc[0]["verdict"] == "unresolved"  # within ±15% on the host: never within on noise


def _sample_measured(sequences: bool) -> tuple[pd.DataFrame, pm.Measured, ReferencePlan]:
    meta = load_phases(SAMPLE)["meta"]
    plan = plan_of(meta)
    terms = pd.read_csv(SAMPLE / "sequences.csv") if sequences else None
    measured = pm.Measured(load(SAMPLE / "ops"), model=plan.model.name, dtype=plan.dtype, impls=meta["impls"],
                           sequences=terms)
    return pd.read_csv(SAMPLE / "reference.csv"), measured, plan


def test_the_committed_sample_publishes_the_composition_of_its_own_ops_and_sequences():
    """The published error is that of the figures the sample's tables show: recomposed here from its ops/ rows and
    sequences.csv against the same reference times, every row; the check sentence quotes the three errors."""
    raw, measured, plan = _sample_measured(sequences=True)
    tables = load_phases(SAMPLE)
    assert len(raw) == 6 and raw["per_layer_error_pct"].notna().all() and raw["sequence_pct"].notna().all()
    for row, shown in zip(raw.itertuples(index=False), tables["reference"].to_dict("records"), strict=True):
        step = plan.composed(measured, row.phase, int(row.batch), int(row.tokens), int(row.layers))
        assert step.complete
        assert step.total_ms == pytest.approx(row.published_composed_ms, rel=1e-9)
        assert row.published_error_pct == pytest.approx(pm.model_error(step.total_ms, row.reference_ms), rel=1e-9)
        if row.reference == "phasebench" and row.phase == "prefill":  # each error with its interval where it has one
            errors = [pct_interval(*(float(shown.get(f"{stem}{end}", np.nan)) for end in ("_pct", "_low_pct",
                                                                                          "_high_pct")))
                      for stem in ("published_error", "interleaved_error", "per_layer_error")]
            assert (f"published {errors[0]} (interleaved {errors[1]}, per layer {errors[2]})"
                    in check_sentence(tables["reference"], "prefill"))
    # the 32-layer decode table is the same composition at the model's depth
    decode = tables["decode"].set_index("batch")
    for batch in tables["meta"]["reference_batches"]:
        full = pm.tpot(measured, plan.model, batch, int(tables["meta"]["context"]))
        assert decode.loc[batch, "tpot_ms"] == pytest.approx(full.total_ms, rel=1e-9)


def test_a_sample_from_before_the_published_error_gets_it_recomposed_from_its_ops(tmp_path):
    """A folder written with the rounds' error only (no sequences.csv then): load_phases recomposes the published
    error from its ops/ rows alone, against the same reference times."""
    raw, measured, plan = _sample_measured(sequences=False)
    old = tmp_path / "old"
    shutil.copytree(SAMPLE, old)
    (old / "sequences.csv").unlink()
    keep = ["reference", "implementation", "phase", "layers", "batch", "tokens", "reference_ms", "rounds", "noisy",
            "left_out"]
    raw[keep].assign(composed_ms=raw["interleaved_composed_ms"], error_pct=raw["interleaved_error_pct"]).to_csv(
        old / "reference.csv", index=False)
    table = load_phases(old)["reference"]
    assert list(table["interleaved_error_pct"]) == list(raw["interleaved_error_pct"])
    for row in table.itertuples(index=False):
        step = plan.composed(measured, row.phase, int(row.batch), int(row.tokens), int(row.layers))
        assert row.published_composed_ms == pytest.approx(step.total_ms, rel=1e-9)
        assert row.published_error_pct == pytest.approx(pm.model_error(step.total_ms, row.reference_ms), rel=1e-9)
    assert table["per_layer_error_pct"].isna().all()


def test_a_table_from_before_the_rounds_reads_its_error_as_the_published_one():
    old = pd.DataFrame([{"phase": "decode", "layers": 2, "batch": 4, "tokens": 48, "reference_ms": 10.0,
                         "composed_ms": 8.0, "error_pct": -20.0, "left_out": ""}])
    row = normalised(old, "cpu").iloc[0]
    assert row["published_error_pct"] == -20.0 and row["published_composed_ms"] == 8.0
    # -20% with no interval: beyond the goal by its point, but a table from before the intervals gives no verdict
    assert np.isnan(row["interleaved_error_pct"]) and row["verdict"] == "unresolved" and not row["over_goal"]


def test_each_check_answers_within_over_or_unresolved_from_its_errors_intervals():
    """Rows with their intervals (±1%), brackets of 8 samples each: an error near 0 is within, -30% over, -14% with a
    reference spread of ±12% unresolved (its interval straddles the 15% goal); the ends come from both sides."""
    from phasebench.bench.spec.interval import error_interval, median_interval

    latency = _latencies(21)
    rows = _rows(latency)
    rows["latency_ci_low_ms"], rows["latency_ci_high_ms"] = 0.99 * rows["latency_ms"], 1.01 * rows["latency_ms"]
    rng = np.random.default_rng(22)
    setting = {("prefill", 1): (1.0, 0.01), ("decode", 1): (1 / 0.7, 0.01), ("decode", 8): (1 / 0.86, 0.12)}
    brackets = []
    for phase, batch, tokens in PLAN.scenarios:
        layer, head = _layer_and_head(latency, phase, batch, tokens)
        slower, spread = setting[phase, batch]
        for k in range(3):
            for depth in PLAN.depths:
                ms = slower * (depth * layer + head)
                draw = list(ms * (1 + spread * rng.uniform(-1, 1, 8)))
                brackets.append({**_bracket(k, phase, batch, tokens, depth, float(np.median(draw))),
                                 "samples_ms": draw})
    measured = _measured(rows)
    table = check_table(brackets, PLAN, published=measured).set_index(["phase", "batch"])
    assert table["published_verdict"].tolist() == ["within", "over", "unresolved"]
    assert table["verdict"].tolist()[:2] == ["within", "over"] and table["over_goal"].tolist()[:2] == [False, True]
    for (phase, batch), row in table.iterrows():
        tokens = 64 if phase == "prefill" else 48
        samples = [s for b in brackets if (b["phase"], b["batch"], b["layers"]) == (phase, batch, 2)
                   for s in b["samples_ms"]]
        ref = median_interval(samples)
        step = PLAN.composed(measured, phase, batch, tokens)
        expected = error_interval(step.interval, (ref.median, ref.low, ref.high))
        assert (row["published_error_pct"], row["published_error_low_pct"], row["published_error_high_pct"]) == \
            pytest.approx(expected, rel=1e-12)
        assert row["published_error_low_pct"] < row["published_error_pct"] < row["published_error_high_pct"]
        assert (row["reference_low_ms"], row["reference_high_ms"]) == (ref.low, ref.high)
        assert row["per_layer_error_low_pct"] < row["per_layer_error_pct"] < row["per_layer_error_high_pct"]
