"""`phasebench phases` end to end on a tiny model, and the reference check's table from brackets of the reference
interleaved with rounds of the ops."""

from __future__ import annotations

import importlib.util
import json

import pandas as pd
import pytest
import torch
from phasebench.analysis.phases.check import COLUMNS, ReferencePlan
from phasebench.bench.phases.run_phases import PhasesConfig
from phasebench.bench.spec.models import model_config

from ...analysis.phase_rows import TINY
from ...conftest import run_cli

SMALL = "name=tiny-phases,hidden=128,intermediate=352,layers=3,q_heads=4,kv_heads=2,head_dim=32,vocab=211"


@pytest.mark.slow
def test_phases_on_a_tiny_model_writes_every_table_and_checks_each_reference(tmp_path):
    references = ["transformers"] if importlib.util.find_spec("transformers") else []
    out = tmp_path / "phases"
    # --warm: cold, every op of this tiny model waits for 2 x LLC written before each call (minutes on a 2-core host);
    # the cold paths have their own tests (the runner's)
    proc = run_cli("phases", "--model", SMALL, "--prompt", "16", "48", "--batch", "1", "2", "--context", "31",
                   "--chunk", "16", "--chunk-batch", "2", "--reference-batch", "1", "2", "--sample-time", "0.02",
                   "--reference-rounds", "2", "--warm", *(["--reference", *references] if references else []),
                   "--out", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("prefill", "decode", "chunked", "interactive", "decode_parts", "reference"):
        assert (out / f"{name}.csv").is_file(), name
    meta = json.loads((out / "phases.json").read_text())
    assert meta["reference_batches"] == [1, 2] and meta["references"] == ["phasebench", *references]
    reference = pd.read_csv(out / "reference.csv")
    assert set(reference["reference"]) == {"phasebench", *references}
    details = pd.read_csv(out / "reference_details.csv")
    for (_, rows), (_, more) in zip(reference.groupby("reference"), details.groupby("reference"), strict=True):
        assert sorted(zip(rows["phase"], rows["batch"], strict=True)) == [("decode", 1), ("decode", 2), ("prefill", 1)]
        assert (more["brackets"] == 3).all() and (more["rounds"] == 2).all() and (rows["reference_ms"] > 0).all()
        assert (rows["layers"] == 2).all() and (more["deep_layers"] == 4).all()
        assert (more["deep_reference_ms"] > 0).all() and (more["zero_layer_ms"] > 0).all()
    assert list(reference.columns) == list(COLUMNS) and reference["per_layer_error_pct"].notna().all()
    brackets = pd.read_csv(out / "reference_brackets.csv")
    assert sorted(set(brackets["bracket"])) == [0, 1, 2] and (brackets["samples"] >= 5).all()
    assert sorted(set(brackets["layers"])) == [0, 2, 4]
    assert meta["check_goal_pct"] == 15.0 and isinstance(meta["over_goal"], list)
    assert sum(meta["check_verdicts"][v] for v in ("within", "over", "unresolved")) == len(reference)
    # each published step's per-iteration cost: phasebench's zero-layer pass less the composed head, a part of its own
    decode = pd.read_csv(out / "decode.csv")
    # (a step with an op left out as noisy has no head to take away: no cost, and its table row says so)
    assert set(meta["iteration_ms"]) <= {"prefill 1 16", "prefill 1 48", "decode 1 31", "decode 2 31"}
    for row in decode.to_dict("records"):
        found = meta["iteration_ms"].get(f"decode {row['batch']} 31")
        # (phases.json keeps 6 decimals of a millisecond)
        assert (found is None and pd.isna(row["iteration_ms"])) or row["iteration_ms"] == pytest.approx(found,
                                                                                                          abs=1e-6)
    check = pd.read_csv(out / "check" / "results.csv")  # the check's ops, measured once per round
    assert len(check) % 2 == 0 and (check["suite"] == "phases-check").all()
    assert json.loads((out / "check" / "run.json").read_text())["rounds"] == 2
    # a composition is a number exactly where none of its ops was left out as noisy
    assert (decode["tpot_ms"].notna() | (decode["noisy_left_out"] > 0)).all()
    assert "Composition against a real forward pass" in proc.stdout
    run = json.loads((out / "ops" / "run.json").read_text())
    assert run["isolation"]["isolated"] and run["suite"] == "phases"


@pytest.mark.slow
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
    assert len(reference) == 2 and (reference["reference_ms"] > 0).all()
    assert reference["composed_ms"].isna().all() and reference["per_layer_error_pct"].isna().all()
    assert (reference["verdict"] == "unresolved").all()


def test_a_bracket_frees_the_ops_last_case_and_the_references_take_turns_at_going_first(monkeypatch):
    from phasebench.bench.phases import reference_check as rc
    from phasebench.bench.sweep import worker

    calls = []

    class Fake:
        def __init__(self, kind):
            self.kind, self.name = kind, f"fake {kind}"

        def prefill(self, batch, tokens, depth):
            calls.append((self.kind, "prefill", batch, depth))

        def decode_step(self, batch, tokens, depth):
            calls.append((self.kind, "decode", batch, depth))

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
    assert [r["reference"] for r in first][::9] == ["phasebench", "transformers"]
    assert [r["reference"] for r in second][::9] == ["transformers", "phasebench"]
    # every scenario at 0, L and 2L layers of one decoder, the depths taking turns at going first
    assert [r["layers"] for r in first][:3] == [0, 2, 4] and [r["layers"] for r in second][:3] == [4, 2, 0]
    assert {(c[0], c[1], c[2], c[3]) for c in calls} == {(k, p, b, d) for k in ("phasebench", "transformers")
                                                         for p, b in (("prefill", 1), ("decode", 1), ("decode", 3))
                                                         for d in (0, 2, 4)}
    assert all(r["samples_ms"] and r["ms"] > 0 and r["bracket"] in (0, 1) for r in first + second)
    assert not rc._BUILT  # freed after the last


@pytest.mark.slow
def test_phases_on_a_tiny_mixture_of_experts_composes_its_experts_and_checks_them(tmp_path):
    references = ["transformers"] if importlib.util.find_spec("transformers") else []
    out = tmp_path / "moe"
    spec = "name=tiny-moe-phases,hidden=128,intermediate=96,layers=3,q_heads=4,kv_heads=2,head_dim=32,vocab=211," \
           "experts=12,top_k=3"
    proc = run_cli("phases", "--model", spec, "--prompt", "16", "--batch", "1", "4", "16", "--context", "31",
                   "--chunk", "16", "--chunk-batch", "2", "--reference-batch", "1", "4", "--sample-time", "0.02",
                   "--reference-rounds", "1", "--warm", *(["--reference", *references] if references else []),
                   "--out", str(out), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    decode = pd.read_csv(out / "decode.csv")
    assert decode["touched_experts"].tolist() == [3, 7, 12] and (decode["experts"] == 12).all()
    assert "experts_ms" in decode and "Routed experts (top 3 of 12, uniform routing)" in proc.stdout
    ops = pd.read_csv(out / "ops" / "results.csv")
    moe = ops[ops["op"] == "moe"]
    assert set(moe["m"]) >= {1, 4, 16, 2 + 16} and (moe["routing"] == "uniform").all()
    reference = pd.read_csv(out / "reference.csv")
    assert set(reference["reference"]) == {"phasebench", *references} and (reference["reference_ms"] > 0).all()
    details = pd.read_csv(out / "reference_details.csv")
    assert details["left_out"].str.contains("router's softmax and top-k").all()
    if references:
        assert details.loc[details["reference"] == "transformers", "implementation"].str.contains(
            "MixtralForCausalLM").all()


KINDS = {  # a tiny MLA mixture (a first dense layer, shared experts, DeepSeek-V2's router), a tiny gpt-oss (window 5)
    "mla": ("name=tiny-mla-phases,hidden=128,intermediate=64,layers=3,q_heads=4,kv_heads=4,head_dim=32,vocab=211,"
            "experts=4,top_k=2,shared_intermediate=64,dense_layers=1,dense_intermediate=160,kv_lora_rank=64,"
            "qk_rope_head_dim=16,qk_nope_head_dim=32,router_renormalize=0", "DeepseekV2ForCausalLM",
            "MLA's absorptions"),
    "window": ("name=tiny-oss-phases,hidden=128,intermediate=64,layers=3,q_heads=4,kv_heads=2,head_dim=32,vocab=211,"
               "experts=4,top_k=2,sliding_window=5,sinks=1", "GptOssForCausalLM", "gpt-oss's attention and expert"),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_phases_of_an_attention_kind_compose_its_layers_and_check_them_against_transformers(kind, tmp_path):
    """MLA (absorbed decode, decompressed prompts) and window / full layers with sinks: TPOT per batch with the KV
    bytes a token costs, and the check's rows against phasebench's decoder and transformers' class of the kind, at L
    and 2L layers, with the dense check's columns."""
    from phasebench.bench.spec.models import parse_model

    spec, hf_class, note = KINDS[kind]
    references = ["transformers"] if importlib.util.find_spec("transformers") else []
    out = tmp_path / kind
    proc = run_cli("phases", "--model", spec, "--prompt", "16", "--batch", "1", "2", "--context", "31", "--chunk",
                   "16", "--chunk-batch", "2", "--reference-batch", "1", "2", "--sample-time", "0.02",
                   "--reference-rounds", "1", "--warm", *(["--reference", *references] if references else []),
                   "--out", str(out), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    model = parse_model(spec)
    decode = pd.read_csv(out / "decode.csv")
    assert decode["batch"].tolist() == [1, 2] and (decode["attention"] == kind).all()
    assert decode["kv_bytes_per_token"].tolist() == pytest.approx([model.kv_bytes_per_token(4, 32)] * 2)
    assert (decode["tpot_ms"].notna() | (decode["noisy_left_out"] > 0)).all()
    assert f"KV cache ({kind.upper()}: " in proc.stdout
    ops = pd.read_csv(out / "ops" / "results.csv")
    assert ("mla" in set(ops["op"])) == (kind == "mla") and (ops["status"] == "ok").all()
    if kind == "window":  # both kinds of layer measured, each with its sinks
        attention = ops[ops["op"] == "attention"]
        assert set(attention["window_left"]) == {-1, 4} and attention["sinks"].all()
    reference = pd.read_csv(out / "reference.csv")
    assert set(reference["reference"]) == {"phasebench", *references} and (reference["reference_ms"] > 0).all()
    details = pd.read_csv(out / "reference_details.csv")
    assert (reference["layers"] == 2).all() and (details["deep_layers"] == 4).all()
    assert (details["deep_reference_ms"] > 0).all() and details["left_out"].str.contains(note).all()
    assert list(reference.columns) == list(COLUMNS)
    if references:
        assert details.loc[details["reference"] == "transformers", "implementation"].str.contains(hf_class).all()


def test_the_default_reference_depth_passes_a_mixtures_dense_layers(tmp_path):
    # at L the layers 2L adds must be mixture layers, as most of the model is: DeepSeek-V3 has 3 dense layers
    for name, layers in (("deepseek-v3", 3), ("deepseek-v2-lite", 2), ("llama-3-8b", 2)):
        cfg = PhasesConfig.defaults(model_config(name), torch.device("cpu"), tmp_path)
        assert cfg.reference_layers == layers


def test_the_float_steps_beside_the_served_ones_carry_the_same_per_iteration_cost(tmp_path):
    # experts packed 4x faster; the zero-layer pass the check measured joins both TPOTs, or the gain is skewed
    import dataclasses

    from phasebench.analysis.phases import model as pm
    from phasebench.bench.phases.run_phases import compose, scenario_steps
    from phasebench.bench.spec import steps as step_defs

    from ...analysis.phase_rows import op_rows

    mix = dataclasses.replace(TINY, name="tiny-served", experts=5, top_k=2, intermediate=40)
    cfg = PhasesConfig.defaults(mix, torch.device("cpu"), tmp_path, batches=(1, 3), context=40, prompts=(16,),
                                chunks=(8,), chunk_batch=3, reference_batches=(1,))
    cfg.experts, cfg.impls = "mxfp4", {**pm.DEFAULT_IMPLS, "moe": "naive"}
    uses = step_defs.distinct_uses(scenario_steps(cfg))
    rows = op_rows(uses, lambda u: 0.5 if u.field_dict.get("scheme") else 2.0 if u.op == "moe" else 0.25,
                   config=mix, impls=cfg.impls)
    iterations = {("decode", b, 40): (7.0, 6.0, 8.0) for b in (1, 3)}
    decode = compose(rows, cfg, iterations)["decode"]
    without = compose(rows, cfg)["decode"]
    for with_it, bare in zip(decode.itertuples(), without.itertuples(), strict=True):
        assert with_it.tpot_ms == pytest.approx(bare.tpot_ms + 7.0)
        assert with_it.unquantized_tpot_ms == pytest.approx(bare.unquantized_tpot_ms + 7.0)
        assert with_it.unquantized_tpot_ms - with_it.tpot_ms == pytest.approx(mix.layers * 1.5)
