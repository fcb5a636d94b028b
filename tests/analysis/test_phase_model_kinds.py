"""The phase model over the attention kinds, on synthetic rows of known latency: an MLA mixture (absorbed decode,
decompressed prompts, a first dense layer) and a gpt-oss-like model (window and full layers with sinks) against
hand-computed sums and the KV bytes a token costs."""

from __future__ import annotations

import pytest
from phasebench.analysis.phases import model as pm
from phasebench.analysis.phases.figures import breakdown_bars, kv_lines
from phasebench.bench.spec import steps as step_defs
from phasebench.bench.spec.models import DecoderConfig

from .phase_rows import op_rows

MLA = DecoderConfig(hidden=96, intermediate=24, layers=3, q_heads=3, kv_heads=3, head_dim=10, vocab=67, name="tiny",
                    experts=5, top_k=2, shared_intermediate=48, dense_layers=1, dense_intermediate=40, kv_lora_rank=14,
                    qk_rope_head_dim=6, qk_nope_head_dim=12, q_lora_rank=22)
WINDOW = DecoderConfig(hidden=64, intermediate=24, layers=5, q_heads=6, kv_heads=2, head_dim=8, vocab=67, name="tiny",
                       experts=5, top_k=2, sliding_window=5, sinks=True)
IMPLS = {"attention": "flash", "linear": "torch", "elementwise": "torch", "moe": "torch", "mla": "torch"}
# ms per row of each op, powers of two so that every sum is exact; the final norm is the layers' rmsnorm row
W = {"rmsnorm": 1, "q_kv_a": 2, "q_b": 4, "q_norm": 8, "kv_norm": 16, "rotary": 32, "kv_append": 64, "q_absorb": 128,
     "v_up": 256, "o": 512, "router": 1024, "gate_up": 2048, "down": 4096, "silu_mul": 8192, "residual_add": 16384,
     "dense_gate_up": 2 ** 15, "dense_down": 2 ** 16, "kv_b": 2 ** 17, "experts": 2 ** 18, "lm_head": 2 ** 19,
     "greedy_pick": 2 ** 20, "qkv": 2 ** 21}


def latency(use) -> float:
    f = use.field_dict
    if use.op == "mla":
        return 0.5 * f["batch"] * f["q_len"] * f["kv_len"]
    if use.op == "attention":  # a window layer's call costs 3 per sequence, a full one 7; MLA's prompts by pairs
        if "sinks" in f:
            return (3 if "window_left" in f else 7) * f["batch"]
        return 0.25 * f["batch"] * f["q_len"] * f["kv_len"]
    return W["rmsnorm" if use.label == "final_norm" else use.label] * f["m"]


def measured(config, steps) -> pm.Measured:
    rows = op_rows(step_defs.distinct_uses(steps), latency, config=config, impls=IMPLS)
    return pm.Measured(rows, model="tiny", dtype="float32", impls=IMPLS)


def mla_layer(rows: int, mlp: str, absorbed: bool) -> float:
    """One MLA layer's ops but its attention call, per hand: both norms and residual adds twice."""
    shared = 2 * W["rmsnorm"] + W["q_kv_a"] + W["q_b"] + W["q_norm"] + W["kv_norm"] + W["rotary"] + W["kv_append"] \
        + W["o"] + W["silu_mul"] + 2 * W["residual_add"] + (W["q_absorb"] + W["v_up"] if absorbed else 0)
    if mlp == "dense":
        return (shared + W["dense_gate_up"] + W["dense_down"]) * rows
    return (shared + W["router"] + W["gate_up"] + W["down"] + W["experts"]) * rows


def head(rows: int) -> float:
    return (W["rmsnorm"] + W["lm_head"] + W["greedy_pick"]) * rows


def test_an_mla_mixture_composes_absorbed_decode_and_decompressed_prompts_by_hand():
    batch, context, prompt = 4, 30, 37
    steps = [step_defs.decode_step(MLA, batch, context), step_defs.prefill_step(MLA, prompt)]
    m = measured(MLA, steps)
    tpot = pm.tpot(m, MLA, batch, context)
    attend = 0.5 * batch * (context + 1)  # the mla row, each of the three layers
    assert tpot.complete and tpot.total_ms == (mla_layer(batch, "dense", True) + 2 * mla_layer(batch, "moe", True)
                                               + 3 * attend + head(batch))
    assert tpot.parts["attention"] == 3 * attend and tpot.parts["experts"] == 2 * W["experts"] * batch
    # a prompt decompresses every latent (kv_b at M = prompt) and attends 3 heads of 18 dims
    ttft = pm.ttft(m, MLA, prompt)
    layer_extra = W["kv_b"] * prompt + 0.25 * prompt * prompt
    assert ttft.total_ms == (mla_layer(prompt, "dense", False) + 2 * mla_layer(prompt, "moe", False)
                             + 3 * layer_extra + head(1))


def test_a_window_model_composes_its_window_and_full_layers_by_hand():
    batch, context = 3, 40
    m = measured(WINDOW, [step_defs.decode_step(WINDOW, batch, context)])
    common = (2 * W["rmsnorm"] + W["qkv"] + W["o"] + W["rotary"] + W["kv_append"] + W["router"] + W["experts"]
              + 2 * W["residual_add"]) * batch
    tpot = pm.tpot(m, WINDOW, batch, context)
    assert tpot.total_ms == 5 * common + 3 * 3 * batch + 2 * 7 * batch + head(batch)
    # a row measured without the window (a GQA layer's) composes neither kind of layer
    plain = step_defs.decode_step(DecoderConfig(**{**WINDOW.__dict__, "sliding_window": 0, "sinks": False}), batch,
                                  context)
    missing = pm.tpot(measured(WINDOW, [plain]), WINDOW, batch, context)
    assert not missing.complete and len(missing.missing) == 2 and all("sinks" in s for s in missing.missing)


def test_the_decode_table_gives_the_kv_bytes_a_token_costs_by_kind():
    context = 40
    for config, per_token in ((MLA, 3 * 20 * 4), (WINDOW, 2 * 2 * 8 * 4 * (2 + 3 * 5 / 41))):
        table = pm.batch_sweep(measured(config, [step_defs.decode_step(config, b, context) for b in (1, 6)]), config,
                               (1, 6), context)
        assert table["kv_bytes_per_token"].tolist() == pytest.approx([per_token] * 2)
        assert table["kv_cache_bytes"].tolist() == pytest.approx([per_token * 41, per_token * 6 * 41])
        (line,) = kv_lines(table)
        assert line.startswith(f"KV cache ({config.attention.upper()}: ") and "at 41 tokens" in line
        assert line.endswith("MiB for batch 6.")


def test_the_breakdown_names_the_models_layers_not_its_fewest_runs():
    items = pm.tpot(measured(MLA, [step_defs.decode_step(MLA, 2, 19)]), MLA, 2, 19).items
    assert breakdown_bars({"decode_parts": items.assign(batch=2, layers=MLA.layers)})[0][0] == "composed\n3 layers"

