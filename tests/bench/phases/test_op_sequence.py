"""The ops of a layer and of the head called in sequence against alone: which sequences a set of steps runs, what a
row holds, and that a sequence that cannot run costs its row only."""

from __future__ import annotations

import statistics

import pytest
import torch
from phasebench.analysis.phases import model as pm
from phasebench.bench.instruments.contention import ContentionProbe
from phasebench.bench.instruments.timing import TimerConfig
from phasebench.bench.phases import op_sequence
from phasebench.bench.spec import steps as step_defs
from phasebench.bench.spec.models import DecoderConfig

# awkward sizes: hidden 80, 5 query heads of 16 over 1 KV head, an odd intermediate and vocabulary
TINY = DecoderConfig(hidden=80, intermediate=211, layers=3, q_heads=5, kv_heads=1, head_dim=16, vocab=97,
                     name="tiny-seq")
QUICK = TimerConfig(warmup_s=0.0, budget_s=0.0, min_samples=3, max_samples=3, flush_l2=False, cold=True)


def test_each_layer_and_head_is_one_sequence_layers_first():
    steps = [step_defs.decode_step(TINY, 2, 17), step_defs.decode_step(TINY, 2, 17), step_defs.prefill_step(TINY, 9),
             *step_defs.chunked_prefill_steps(TINY, 9, 4, 2, 17)]
    found = op_sequence.distinct_sequences(steps)
    kinds = [kind for kind, _ in found]
    assert kinds == sorted(kinds, key=lambda k: k != "layer") and kinds.count("head") == 3  # rows 2, 1 and 3
    keys = [pm.sequence_key(uses) for _, uses in found]
    assert len(set(keys)) == len(keys)  # the repeated decode step is one sequence
    expected = {pm.sequence_key(uses) for step in steps for _, _, uses in pm.sequence_parts(step)}
    assert set(keys) == expected


@pytest.mark.parametrize("cold", [True, False])
def test_a_layer_in_sequence_gives_its_time_its_ops_alone_and_the_term_between(cold, monkeypatch):
    monkeypatch.setattr(op_sequence, "TURNS", 2)  # the turns' arithmetic, in a third of the time of six
    kind, _, uses = pm.sequence_parts(step_defs.decode_step(TINY, 3, 29))[0]
    row = op_sequence.time_sequence(kind, uses, "float32", TINY.name, dict(pm.DEFAULT_IMPLS), torch.device("cpu"),
                                    QUICK, ContentionProbe(torch.device("cpu")), cold)
    assert row["status"] == "ok" and row["sequence"] == "layer" and row["key"] == pm.sequence_key(uses)
    assert row["sequence_ms"] > 0 and row["alone_ms"] > 0 and row["samples"] == op_sequence.TURNS * 2 * 3
    # the host's form: one ratio per ABBA turn, the term their median's excess over the ops alone
    effects = [float(v) for v in row["turn_effects"].split(";")]
    assert row["form"] == "ratio" and row["turns"] == len(effects) == op_sequence.TURNS
    assert all(e > 0 for e in effects)
    assert row["term_ms"] == pytest.approx((statistics.median(effects) - 1) * row["alone_ms"], rel=1e-6)
    assert row["ops"] == 12 and row["phase"] == "decode" and row["m"] == 3 and row["cold"] is cold
    assert "2 x elementwise rmsnorm" in row["uses"] and "1 x attention attention" in row["uses"]
    assert set(row) <= set(op_sequence.COLUMNS)


def test_a_sequence_that_cannot_run_costs_its_row_and_the_others_go_on():
    layer = pm.sequence_parts(step_defs.decode_step(TINY, 1, 8))
    impls = {**pm.DEFAULT_IMPLS, "attention": "no-such-impl"}
    rows = op_sequence.time_sequences([(kind, uses) for kind, _, uses in layer], "float32", TINY.name, impls, "cpu",
                                      QUICK)
    assert [r["status"] for r in rows] == ["failed", "ok"]  # the head runs no attention
    assert "no-such-impl" in rows[0]["reason"] and "\n" not in rows[0]["reason"]
    interpreted = op_sequence.time_sequences([(kind, uses) for kind, _, uses in layer], "float32", TINY.name,
                                             {**pm.DEFAULT_IMPLS, "linear": "triton"}, "cpu", QUICK)
    if torch.cuda.is_available():
        pytest.skip("Triton compiles here: no interpreter mode to refuse")
    assert all(r["status"] == "skipped" and "interpreter" in r["reason"] for r in interpreted)
    late = op_sequence.time_sequences([(kind, uses) for kind, _, uses in layer], "float32", TINY.name,
                                      dict(pm.DEFAULT_IMPLS), "cpu", QUICK, budget_end=0.0)
    assert [(r["status"], r["reason"]) for r in late] == [("skipped", "time budget")] * 2
