"""Synthetic runner rows for the phase model: every case a set of steps runs, with a latency chosen by the test."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd
from phasebench.analysis.phases import check, remedies
from phasebench.analysis.phases import model as pm
from phasebench.bench.spec import steps as step_defs
from phasebench.bench.spec.models import DecoderConfig

TINY = DecoderConfig(hidden=96, intermediate=200, layers=3, q_heads=6, kv_heads=2, head_dim=16, vocab=97, name="tiny")
IMPLS = {"attention": "flash", "linear": "torch", "elementwise": "torch"}


def scenario_steps(config, prompts, batches, context, chunks, chunk_batch, chunk_prompt) -> list:
    """The steps bench.phases composes (its scenario_steps, without torch)."""
    out = [step_defs.prefill_step(config, p) for p in (*prompts, chunk_prompt)]
    out += [step_defs.decode_step(config, b, c) for b in {*batches, chunk_batch} for c in {context, *prompts}]
    for chunk in chunks:
        for batch in (chunk_batch, 0):
            out += step_defs.chunked_prefill_steps(config, chunk_prompt, chunk, batch, context)
    return out


def op_rows(uses, latency, *, config=TINY, dtype="float32", device="cpu", mode="compiled",
            timer="perf_counter_ns", impls=IMPLS) -> pd.DataFrame:
    """One ok row per use, with runner column names and the use's case fields; latency(use) gives latency_ms."""
    rows = []
    for use in uses:
        rows.append({"op": use.op, "impl": impls[use.op], "status": "ok", "dtype": dtype, "model": config.name,
                     "device": device, "mode": mode, "timer": timer, "latency_ms": float(latency(use)),
                     **use.field_dict})
    return pd.DataFrame(rows)


def compose(df: pd.DataFrame, config=TINY, *, prompts=(16, 64), batches=(1, 2, 4, 8, 16), context=48,
            chunks=(8, 16, 32), chunk_batch=4, chunk_prompt=64, reference_layers=2, reference_ms=None,
            dtype="float32", device="cpu", interference=None) -> dict:
    """The tables `phasebench phases` writes (bench.phases compose, a reference table as reference_check writes
    it), from rows; reference_ms maps phase -> the measured pass (default: 1.2 x the composition)."""
    measured = pm.Measured(df, model=config.name, dtype=dtype)
    tables = {
        "prefill": pm.prefill_table(measured, config, prompts),
        "decode": pm.batch_sweep(measured, config, batches, context),
        "chunked": pm.chunk_table(measured, config, chunk_prompt, chunks, chunk_batch, context),
        "colocated": remedies.colocated_table(measured, config, chunk_prompt, chunk_batch, context, interference),
        "interactive": pm.interactive_limits(measured, config, prompts, batches),
        "decode_parts": pm.tpot(measured, config, chunk_batch, context).items.drop(columns="rounds"),
    }
    plan = check.ReferencePlan(config, reference_layers, device, dtype, chunk_prompt, (chunk_batch,), context)
    brackets = []
    for phase, batch, tokens in plan.scenarios:
        step = plan.composed(measured, phase, batch, tokens)
        real = (reference_ms or {}).get(phase, 1.2 * step.total_ms)
        head = step.parts["head"]
        for k in range(3):  # the real pass: its head, and its layers at the pace that gives `real` at L layers
            brackets += [{"reference": "phasebench", "bracket": k, "phase": phase, "batch": batch, "tokens": tokens,
                          "layers": d, "ms": head + (real - head) * d / reference_layers,
                          "samples_ms": [1.0]} for d in plan.depths]
    tables["reference"], tables["reference_details"] = check.check_table(brackets, plan, published=measured,
                                                                         per_round=[measured] * 2)
    tables["meta"] = {"model": dataclasses.asdict(config), "device": device, "dtype": dtype, "impls": dict(IMPLS),
                      "prompts": list(prompts), "batches": list(batches), "context": context, "chunks": list(chunks),
                      "chunk_batch": chunk_batch, "chunk_prompt": chunk_prompt, "reference_layers": reference_layers,
                      "measured_cases": len(df)}
    return tables


def write_phases(folder, tables: dict):
    """The folder as run_phases leaves it (without ops/): NAME.csv per table and phases.json."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, table in tables.items():
        if name != "meta":
            table.to_csv(folder / f"{name}.csv", index=False)
    (folder / "phases.json").write_text(json.dumps(tables["meta"], indent=1))
    return folder
