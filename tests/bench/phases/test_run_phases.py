"""`phasebench phases` end to end on a tiny model, and the reference check's table from brackets of the reference
interleaved with rounds of the ops."""

from __future__ import annotations

import dataclasses
import importlib.util
import json

import pandas as pd
import pytest
from phasebench.analysis.phases import model as pm
from phasebench.bench.phases.reference_check import ReferencePlan, reference_table

from ...analysis.phase_rows import TINY, op_rows
from ...conftest import run_cli

SMALL = "name=tiny-phases,hidden=128,intermediate=352,layers=3,q_heads=4,kv_heads=2,head_dim=32,vocab=211"


def _latency(use) -> float:
    f = use.field_dict
    return 0.01 * (f.get("m") or f["batch"] * f["q_len"]) + 0.001 * f.get("kv_len", 0)


def test_the_reference_table_compares_rounds_with_their_brackets_so_a_shared_drift_cancels():
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
    table = reference_table(brackets, measured, per_round, plan).set_index(["phase", "batch"])
    assert list(table.index) == [("prefill", 1), ("decode", 1), ("decode", 8)]
    prefill = table.loc[("prefill", 1)]
    assert prefill["reference_ms"] == pytest.approx(1.2 * composed["prefill", 1])  # median of the 4 brackets
    assert prefill["composed_ms"] == pytest.approx(1.2 * composed["prefill", 1])  # each op's median over 3 rounds
    assert prefill["error_pct"] == pytest.approx(0.0, abs=1e-9) and prefill["drift_pct"] == pytest.approx(50.0)
    assert prefill["round_error_min_pct"] == pytest.approx(100 * (1 / 1.05 - 1)) and prefill["round_error_max_pct"] \
        == pytest.approx(0.0, abs=1e-9)
    assert not prefill["noisy"] and prefill["samples"] == 4 and prefill["brackets"] == 4 and prefill["rounds"] == 3
    decode1 = table.loc[("decode", 1)]
    assert decode1["noisy"] and decode1["noise_reason"] == ("the rounds disagree: errors +0% to +40%, interquartile "
                                                            "range 20 points")
    assert decode1["composed_ms"] == pytest.approx(pm.tpot(measured, small, 1, 48).total_ms)
    assert decode1["error_pct"] == pytest.approx(20.0)
    decode8 = table.loc[("decode", 8)]
    assert decode8["noisy"] and decode8["noise_reason"].startswith("busy in 3 of 4 brackets (busy host)")
    assert decode8["error_pct"] == pytest.approx(0.0, abs=1e-9)
    unbuilt = [{"reference": "transformers", "bracket": k, "phase": "prefill", "batch": 1, "tokens": 64,
                "error": "no transformers"} for k in range(2)]
    row = reference_table(unbuilt, measured, per_round, plan).iloc[0]
    assert pd.isna(row["reference_ms"]) and row["error"] == "no transformers" and not row["noisy"]
    assert row["brackets"] == 0 and pd.isna(row["error_pct"])


def test_phases_on_a_tiny_model_writes_every_table_and_checks_each_reference(tmp_path):
    references = ["transformers"] if importlib.util.find_spec("transformers") else []
    out = tmp_path / "phases"
    proc = run_cli("phases", "--model", SMALL, "--prompt", "16", "48", "--batch", "1", "2", "--context", "31",
                   "--chunk", "16", "--chunk-batch", "2", "--reference-batch", "1", "2", "--sample-time", "0.02",
                   "--reference-rounds", "2", *(["--reference", *references] if references else []),
                   "--out", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("prefill", "decode", "chunked", "interactive", "decode_parts", "reference"):
        assert (out / f"{name}.csv").is_file(), name
    meta = json.loads((out / "phases.json").read_text())
    assert meta["reference_batches"] == [1, 2] and meta["references"] == ["phasebench", *references]
    reference = pd.read_csv(out / "reference.csv")
    assert set(reference["reference"]) == {"phasebench", *references}
    for _, rows in reference.groupby("reference"):
        assert sorted(zip(rows["phase"], rows["batch"], strict=True)) == [("decode", 1), ("decode", 2), ("prefill", 1)]
        assert (rows["brackets"] == 3).all() and (rows["rounds"] == 2).all() and (rows["reference_ms"] > 0).all()
    brackets = pd.read_csv(out / "reference_brackets.csv")
    assert sorted(set(brackets["bracket"])) == [0, 1, 2] and (brackets["samples"] >= 3).all()
    check = pd.read_csv(out / "check" / "results.csv")  # the check's ops, measured once per round
    assert len(check) % 2 == 0 and (check["suite"] == "phases-check").all()
    assert json.loads((out / "check" / "run.json").read_text())["rounds"] == 2
    # a composition is a number exactly where none of its ops was left out as noisy
    decode = pd.read_csv(out / "decode.csv")
    assert (decode["tpot_ms"].notna() | (decode["noisy_left_out"] > 0)).all()
    assert "Composition against a real forward pass" in proc.stdout
    run = json.loads((out / "ops" / "run.json").read_text())
    assert run["isolation"]["isolated"] and run["suite"] == "phases"


def test_a_time_budget_bounds_the_ops_and_keeps_time_for_the_reference(tmp_path):
    """4 s keeps 3 s for the reference and the tables: the start-up has spent the ops' second before the first op."""
    out = tmp_path / "phases"
    proc = run_cli("phases", "--model", SMALL, "--prompt", "16", "--batch", "1", "--context", "15", "--chunk", "8",
                   "--chunk-batch", "1", "--reference-batch", "1", "--sample-time", "0.02", "--time-budget", "4",
                   "--out", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ops = pd.read_csv(out / "ops" / "results.csv")
    assert len(ops) > 10 and (ops["status"] == "skipped").all()
    assert ops["reason"].str.startswith("time budget").all()
    reference = pd.read_csv(out / "reference.csv")
    assert len(reference) == 2 and (reference["reference_ms"] > 0).all() and reference["composed_ms"].isna().all()


def test_a_bracket_frees_the_ops_last_case_and_the_references_take_turns_at_going_first(monkeypatch):
    from phasebench.bench.phases import reference_check as rc
    from phasebench.bench.sweep import worker

    calls = []

    class Fake:
        def __init__(self, kind):
            self.kind, self.name = kind, f"fake {kind}"

        def prefill(self, batch, tokens):
            calls.append((self.kind, "prefill", batch))

        def decode_step(self, batch, tokens):
            calls.append((self.kind, "decode", batch))

    monkeypatch.setattr(rc, "_decoder", lambda kind, plan: Fake(kind))
    plan = ReferencePlan(TINY, 2, "cpu", "float32", prompt=16, batches=(1, 3), context=9,
                         kinds=("phasebench", "transformers"))
    worker._STATE.update(case="held", state="inputs of the ops' last case")
    try:
        first = rc.time_bracket(plan, 0, last=False)
        assert worker._STATE["state"] is None and worker._STATE["case"] is None
        second = rc.time_bracket(plan, 1, last=True)
    finally:
        worker._STATE.clear()
    assert [r["reference"] for r in first][::3] == ["phasebench", "transformers"]
    assert [r["reference"] for r in second][::3] == ["transformers", "phasebench"]
    assert all(r["samples_ms"] and r["ms"] > 0 and r["bracket"] in (0, 1) for r in first + second)
    assert {c[0] for c in calls} == {"phasebench", "transformers"} and not rc._BUILT  # freed after the last
