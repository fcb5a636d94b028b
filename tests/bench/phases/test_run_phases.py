"""`phasebench phases` end to end on a tiny model, and the reference check's table from timings taken before and
after the ops."""

from __future__ import annotations

import dataclasses
import importlib.util
import json

import pandas as pd
import pytest
from phasebench.analysis import phase_model as pm
from phasebench.bench.phases.reference_check import ReferencePlan, reference_table
from phasebench.bench.spec import steps as step_defs

from ...analysis.phase_rows import TINY, op_rows
from ...conftest import run_cli

SMALL = "name=tiny-phases,hidden=128,intermediate=352,layers=3,q_heads=4,kv_heads=2,head_dim=32,vocab=211"


def _latency(use) -> float:
    f = use.field_dict
    return 0.01 * (f.get("m") or f["batch"] * f["q_len"]) + 0.001 * f.get("kv_len", 0)


def test_the_reference_table_pools_both_brackets_and_flags_drift_beside_the_composition():
    plan = ReferencePlan(TINY, 2, "cpu", "float32", prompt=64, batches=(1, 8), context=48)
    small = dataclasses.replace(TINY, layers=2)
    uses = step_defs.distinct_uses([step_defs.prefill_step(small, 64), step_defs.decode_step(small, 1, 48),
                                    step_defs.decode_step(small, 8, 48)])
    measured = pm.Measured(op_rows(uses, _latency), model=TINY.name, dtype="float32")

    def timed(ms, samples, noisy=False):
        return {"ms": ms, "samples_ms": samples, "noisy": noisy, "noise_reason": "busy host" * noisy}

    before = [{"reference": "phasebench", "phase": p, "batch": b, "tokens": t, **timed(10.0, [9.0, 10.0, 11.0])}
              for p, b, t in plan.scenarios]
    after = [dict(before[0], **timed(10.5, [10.0, 10.5, 11.0])),  # within 10%: quiet
             dict(before[1], **timed(10.0, [10.0, 10.0, 10.0], noisy=True)),  # busy while timed
             dict(before[2], **timed(14.0, [13.0, 14.0, 15.0]))]  # moved 40% between the brackets
    table = reference_table(before, after, measured, plan).set_index(["phase", "batch"])
    assert list(table.index) == [("prefill", 1), ("decode", 1), ("decode", 8)]
    prefill = table.loc[("prefill", 1)]
    assert prefill["reference_ms"] == pytest.approx(10.25) and prefill["samples"] == 6 and not prefill["noisy"]
    assert prefill["drift_pct"] == pytest.approx(5.0)
    assert table.loc[("decode", 1), "noisy"] and table.loc[("decode", 1), "noise_reason"] == "busy host"
    decode8 = table.loc[("decode", 8)]
    assert decode8["noisy"] and "moved +40%" in decode8["noise_reason"] and decode8["reference_ms"] == 12.0
    composed = pm.tpot(measured, small, 8, 48).total_ms
    assert decode8["composed_ms"] == pytest.approx(composed)
    assert decode8["error_pct"] == pytest.approx(100 * (composed - 12.0) / 12.0)
    unbuilt = [{"reference": "transformers", "phase": "prefill", "batch": 1, "tokens": 64, "error": "no transformers"}]
    row = reference_table(unbuilt, [], measured, plan).iloc[0]
    assert pd.isna(row["reference_ms"]) and row["error"] == "no transformers" and not row["noisy"]


def test_phases_on_a_tiny_model_writes_every_table_and_checks_each_reference(tmp_path):
    references = ["transformers"] if importlib.util.find_spec("transformers") else []
    out = tmp_path / "phases"
    proc = run_cli("phases", "--model", SMALL, "--prompt", "16", "48", "--batch", "1", "2", "--context", "31",
                   "--chunk", "16", "--chunk-batch", "2", "--reference-batch", "1", "2", "--sample-time", "0.02",
                   *(["--reference", *references] if references else []), "--out", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("prefill", "decode", "chunked", "interactive", "decode_parts", "reference"):
        assert (out / f"{name}.csv").is_file(), name
    meta = json.loads((out / "phases.json").read_text())
    assert meta["reference_batches"] == [1, 2] and meta["references"] == ["phasebench", *references]
    reference = pd.read_csv(out / "reference.csv")
    assert set(reference["reference"]) == {"phasebench", *references}
    for _, rows in reference.groupby("reference"):
        assert sorted(zip(rows["phase"], rows["batch"], strict=True)) == [("decode", 1), ("decode", 2), ("prefill", 1)]
        assert (rows["reference_before_ms"] > 0).all() and (rows["reference_after_ms"] > 0).all()
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
