"""Step definitions: what prefill, decode and the hybrid chunked step run, per layer and per step."""

from __future__ import annotations

import pytest
from phasebench.bench.spec import steps
from phasebench.bench.spec.models import DecoderConfig

TINY = DecoderConfig(hidden=96, intermediate=200, layers=3, q_heads=6, kv_heads=2, head_dim=16, vocab=97,
                     name="tiny-steps")


def by_label(uses):
    out = {}
    for u in uses:
        out.setdefault(u.label, []).append(u)
    return out


def test_prefill_runs_every_layer_op_at_m_prompt_and_the_head_on_the_last_token():
    uses = by_label(steps.prefill_step(TINY, 97))
    for name, (n, k) in TINY.projections().items():
        if name == "lm_head":
            (head,) = uses["lm_head"]
            assert head.count == 1 and head.field_dict["m"] == 1
            assert (head.field_dict["n"], head.field_dict["k"]) == (n, k)
        else:
            (use,) = uses[name]
            assert use.count == TINY.layers and use.field_dict == {"m": 97, "n": n, "k": k, "phase": "prefill",
                                                                   "projection": name}
    (attn,) = uses["attention"]
    assert attn.field_dict == {"batch": 1, "q_heads": 6, "kv_heads": 2, "q_len": 97, "kv_len": 97, "head_dim": 16,
                               "causal": True, "page_size": 0}
    assert uses["rmsnorm"][0].count == 2 * TINY.layers and uses["residual_add"][0].count == 2 * TINY.layers
    assert {u.part for u in steps.prefill_step(TINY, 97)} == set(steps.PARTS) - {"experts"}  # a dense model has none
    assert {u.part for u in steps.prefill_step(MOE, 97)} == set(steps.PARTS)


def test_decode_reads_the_cache_once_per_layer_at_m_batch():
    uses = by_label(steps.decode_step(TINY, 5, 1025))
    assert uses["attention"][0].field_dict["kv_len"] == 1026 and uses["attention"][0].field_dict["q_len"] == 1
    assert all(u.field_dict["m"] == 5 for u in uses["qkv"] + uses["lm_head"] + uses["greedy_pick"])


def test_a_paged_cache_pages_the_attention_that_reads_it_and_not_the_prompts_own():
    decode = [u.field_dict for u in steps.decode_step(TINY, 5, 1025, page_size=16) if u.op == "attention"]
    assert [d["page_size"] for d in decode] == [16]
    hybrid = steps.chunked_prefill_steps(TINY, 100, 32, 4, 200, page_size=64)
    assert {u.field_dict["page_size"] for s in hybrid for u in s if u.op == "attention"} == {64}
    prompt = [u.field_dict for u in steps.prefill_step(TINY, 97) if u.op == "attention"]
    assert [p["page_size"] for p in prompt] == [0]


def test_chunked_prefill_covers_the_prompt_with_hybrid_steps():
    chunked = steps.chunked_prefill_steps(TINY, 100, 32, 4, 200)
    assert len(chunked) == 4  # 32 + 32 + 32 + 4
    attn = [[u.field_dict for u in s if u.label == "attention"] for s in chunked]
    assert [a[1]["q_len"] for a in attn] == [32, 32, 32, 4] and [a[1]["kv_len"] for a in attn] == [32, 64, 96, 100]
    assert all(a[0] == {"batch": 4, "q_heads": 6, "kv_heads": 2, "q_len": 1, "kv_len": 201, "head_dim": 16,
                        "causal": True, "page_size": 0} for a in attn)
    ms = [[u.field_dict["m"] for u in s if u.label == "qkv"][0] for s in chunked]
    assert ms == [36, 36, 36, 8]
    heads = [[u.field_dict["m"] for u in s if u.label == "lm_head"] for s in chunked]
    assert heads == [[4], [4], [4], [5]]  # the prompt's last token joins the decode rows at the end
    alone = steps.chunked_prefill_steps(TINY, 100, 32, 0, 200)
    assert [len([u for u in s if u.label == "attention"]) for s in alone] == [1, 1, 1, 1]
    assert [[u for u in s if u.label == "lm_head"] != [] for s in alone] == [False, False, False, True]
    with pytest.raises(ValueError, match="chunk: must be a positive int"):
        steps.chunked_prefill_steps(TINY, 100, 0, 4, 200)


def test_verify_runs_gamma_plus_one_tokens_per_sequence_against_the_context():
    uses = by_label(steps.verify_step(TINY, 3, 61, 4))
    assert uses["attention"][0].field_dict["q_len"] == 5 and uses["attention"][0].field_dict["kv_len"] == 66
    assert uses["qkv"][0].field_dict["m"] == 15 and uses["qkv"][0].field_dict["phase"] == "decode"
    assert uses["lm_head"][0].field_dict["m"] == 15 and uses["lm_head"][0].count == 1  # every verified position
    assert uses["kv_append"][0].field_dict["cache_len"] == 3 * 66
    for gamma in (0, 2.0, True):
        with pytest.raises(ValueError, match=r"^gamma: "):
            steps.verify_step(TINY, 3, 61, gamma)


def test_distinct_uses_name_each_case_once():
    all_steps = [steps.decode_step(TINY, 4, 64), steps.decode_step(TINY, 4, 64), steps.prefill_step(TINY, 64)]
    uses = steps.distinct_uses(all_steps)
    assert len({(u.op, u.fields) for u in uses}) == len(uses)
    # the layer's rmsnorm and the final norm at the same M are one case
    assert sum(u.label in ("rmsnorm", "final_norm") and u.field_dict["m"] == 4 for u in uses) == 1


def comparable(ops_list):
    """The traced or composed ops as (op, shape) pairs; a one-query attention is the same with or without
    the bottom-right causal mask."""
    out = []
    for op in ops_list:
        shape = {k: v for k, v in op.items() if k not in ("op", "name", "scope", "label")}
        if op["op"] == "attention" and shape.get("q_len") == 1:
            shape.pop("causal", None)
        out.append((op["op"], op.get("name"), tuple(sorted(shape.items()))))
    return sorted(out, key=repr)


def composed(uses, config):
    """The phase model's layer projections, attention, lm_head and greedy pick, in the reference's terms."""
    out = []
    for u in uses:
        f = u.field_dict
        if u.op == "linear":
            out += [{"op": "linear", "name": f["projection"], "m": f["m"], "n": f["n"], "k": f["k"]}]
        elif u.op == "attention":
            out += [{"op": "attention", "name": "attention", **f}]
        elif u.label == "greedy_pick":
            out += [{"op": "argmax", "name": "greedy", "m": f["m"], "n": f["n"]}]
        elif u.op == "moe":  # the traced call sees no routing: it routes its own tokens
            out += [{"op": "moe", "name": "experts", **{k: v for k, v in f.items() if k not in ("routing", "phase")}}]
        elif u.op == "mla":
            out += [{"op": "mla", "name": "attention", **f}]
    return out


def expanded(uses):
    """Each use as often as the step runs it (its count), in the reference's terms."""
    return [op for u in uses for op in composed([u], None) * u.count]


MOE = DecoderConfig(hidden=96, intermediate=40, layers=3, q_heads=6, kv_heads=2, head_dim=16, vocab=97, name="moe",
                    experts=12, top_k=3, shared_intermediate=64)


# an MLA mixture (a q_lora down projection, a first dense layer, shared experts) and a gpt-oss-like model (window
# layers alternating with full ones, sinks), at awkward dims
MLA = DecoderConfig(hidden=96, intermediate=24, layers=3, q_heads=3, kv_heads=3, head_dim=10, vocab=67, name="mla",
                    experts=5, top_k=2, shared_intermediate=48, dense_layers=1, dense_intermediate=40, kv_lora_rank=14,
                    qk_rope_head_dim=6, qk_nope_head_dim=12, q_lora_rank=22)
WINDOW = DecoderConfig(hidden=64, intermediate=24, layers=5, q_heads=6, kv_heads=2, head_dim=8, vocab=67,
                       name="window", experts=5, top_k=2, sliding_window=5, sinks=True)


@pytest.mark.parametrize("config", [TINY, MOE, MLA, WINDOW], ids=["dense", "mixture", "mla", "window"])
@pytest.mark.parametrize("phase", ["prefill", "decode", "verify"])
def test_the_phase_model_and_the_reference_decoder_run_the_same_shapes(phase, config):
    """Every layer of phasebench's decoder traced (on the meta device) runs what the composition counts, each op as
    often: linear, attention, mla and moe calls and the head."""
    import torch
    from phasebench.bench.phases import reference_decoder as ref

    if phase == "prefill":
        traced, uses = ref.ops_of_prefill(config, 1, 97, config.layers), steps.prefill_step(config, 97)
    elif phase == "verify":  # the target's pass over the last token and 4 draft tokens, the head on each
        decoder = ref.ReferenceDecoder(config, config.layers, "meta", torch.float32, max_tokens=205, max_batch=3)
        with decoder.record_ops() as traced:
            decoder.extend(3, 200, 5, every_position=True)
        uses = steps.verify_step(config, 3, 200, 4)
    else:
        traced, uses = ref.ops_of_decode(config, 3, 200, config.layers), steps.decode_step(config, 3, 200)
    assert comparable(traced) == comparable(expanded(uses))
    assert ("moe" in {o["op"] for o in traced}) == config.is_moe
    assert ("mla" in {o["op"] for o in traced}) == (config.attention == "mla" and phase == "decode")


def test_an_mla_decode_runs_absorbed_and_its_prompts_decompressed():
    """Hand-written: q_kv_a at q_lora + latent (14 + 6 = 20), q_b to 3 heads of 12 + 6; decode absorbs kv_b's key
    half into the queries (3 x 14 by 12), attends the 20-wide latent, and takes 3 heads of 10 out of it (14 wide);
    a prompt up-projects every cached latent (3 x (12 + 10) by 14) and attends 3 heads of 18 dims."""
    decode = steps.decode_step(MLA, 4, 30)
    layer = {(u.group, u.label): u for u in decode}
    mla = layer[("moe/full", "attention")]
    assert (mla.op, mla.count) == ("mla", 2) and mla.field_dict == {"batch": 4, "q_heads": 3, "q_len": 1, "kv_len": 31,
                                                                   "head_dim": 20, "head_dim_v": 14, "page_size": 0}
    for label, (n, k) in {"q_kv_a": (42, 96), "q_b": (54, 22), "q_absorb": (42, 12), "v_up": (30, 14),
                          "o": (96, 30), "router": (5, 96), "gate_up": (96, 96), "down": (96, 48)}.items():
        use = layer[("moe/full", label)]
        assert (use.field_dict["m"], use.field_dict["n"], use.field_dict["k"], use.count) == (4, n, k, 2), label
    dense = {u.label: u for u in decode if u.group == "dense/full"}
    assert dense["dense_gate_up"].field_dict["n"] == 80 and dense["dense_down"].field_dict["k"] == 40
    assert {"router", "experts", "gate_up", "kv_b"}.isdisjoint(dense) and dense["attention"].count == 1
    assert layer[("moe/full", "kv_append")].field_dict == {"kind": "kv_append", "m": 4, "n": 1, "head_dim": 10,
                                                          "cache_len": 124, "phase": "decode"}
    assert layer[("moe/full", "rotary")].field_dict["head_dim"] == 6 and layer[("moe/full", "kv_norm")].count == 2
    prompt = {(u.group, u.label): u for u in steps.prefill_step(MLA, 37)}
    attention = prompt[("moe/full", "attention")]
    assert attention.op == "attention" and attention.field_dict == {
        "batch": 1, "q_heads": 3, "kv_heads": 3, "q_len": 37, "kv_len": 37, "head_dim": 18, "causal": True,
        "page_size": 0}
    kv_b = prompt[("moe/full", "kv_b")].field_dict
    assert (kv_b["m"], kv_b["n"], kv_b["k"]) == (37, 66, 14) and ("moe/full", "q_absorb") not in prompt
    # a hybrid step: the decode users' call absorbed (paged as asked), the chunk decompressed over its prefix
    (hybrid, *_) = steps.chunked_prefill_steps(MLA, 40, 16, 2, 30, page_size=8)
    calls = [(u.op, u.field_dict.get("m"), u.field_dict.get("page_size")) for u in hybrid
             if u.group == "moe/full" and u.label in ("q_absorb", "attention", "kv_b")]
    assert calls == [("linear", 2, None), ("mla", None, 8), ("linear", 16, None), ("attention", None, 0)]


def test_a_window_model_counts_its_window_and_full_layers_each_with_sinks():
    uses = steps.decode_step(WINDOW, 3, 40)
    attention = [(u.group, u.count, u.field_dict.get("window_left", -1), u.field_dict["sinks"]) for u in uses
                 if u.op == "attention"]
    assert attention == [("moe/window", 3, 4, True), ("moe/full", 2, -1, True)]
    assert sum(u.count for u in uses if u.label == "qkv") == 5 and {u.group for u in uses} == {"moe/window",
                                                                                               "moe/full", ""}
    dense = [u for u in steps.decode_step(TINY, 3, 40) if u.op == "attention"]
    assert "window_left" not in dense[0].field_dict and "sinks" not in dense[0].field_dict  # rows of any age match


def test_with_weights_packs_the_layer_projections_only():
    step = steps.decode_step(TINY, 3, 64)
    assert steps.with_weights(step, "") == step
    packed = steps.with_weights(step, "int8")
    changed = [(a, b) for a, b in zip(step, packed, strict=True) if a != b]
    assert {a.label for a, _ in changed} == {"qkv", "o", "gate_up", "down"}
    for a, b in changed:
        assert b.op == "qlinear" and b.field_dict == {**a.field_dict, "scheme": "int8"} and b.count == a.count


def test_a_draft_defaults_to_the_family_preset_and_must_be_smaller_with_the_same_vocabulary():
    from phasebench.bench.spec.models import MODELS, draft_config, model_weight_count

    assert draft_config(MODELS["llama-3-8b"]).name == "llama-3.2-1b"
    for target, draft in (("llama-3-8b", "llama-3.2-1b"), ("llama-2-7b", "tinyllama-1.1b"),
                          ("gemma-2-9b", "gemma-2-2b"), ("llama-3-70b", "llama-3-8b")):
        assert MODELS[draft].vocab == MODELS[target].vocab
        assert model_weight_count(MODELS[draft]) < model_weight_count(MODELS[target])
    small = "name=tiny-draft-steps,hidden=64,intermediate=96,layers=1,q_heads=4,kv_heads=2,head_dim=16,vocab=97"
    assert draft_config(TINY, small).hidden == 64
    with pytest.raises(ValueError, match=r"^draft: no default draft for 'tiny-steps'"):
        draft_config(TINY)
    with pytest.raises(ValueError, match=r"^draft: .* vocabulary of 128256, tiny-steps of 97"):
        draft_config(TINY, "llama-3.2-1b")
    with pytest.raises(ValueError, match=r"^draft: llama-3-8b .* is not smaller than llama-3.2-1b"):
        draft_config(MODELS["llama-3.2-1b"], "llama-3-8b")
    with pytest.raises(ValueError, match=r"^draft: unknown model 'nope'"):
        draft_config(TINY, "nope")


def test_with_weights_packs_a_mixtures_experts_and_keeps_the_router_and_absorbed_halves():
    from phasebench.bench.spec.models import model_config

    for name in ("gpt-oss-20b", "deepseek-v3"):
        step = steps.decode_step(model_config(name), 4, 1000)
        packed = steps.with_weights(step, "fp8-b128", "mxfp4")
        moe = [u for u in packed if u.op == "moe"]
        assert moe and all(u.field_dict["scheme"] == "mxfp4" for u in moe)
        linear = {u.label for u in packed if u.op == "linear"}
        assert linear & steps.KEPT_FLOAT == {u.label for u in step if u.op == "linear"} & steps.KEPT_FLOAT
        assert "router" in linear and all(u.field_dict["scheme"] == "fp8-b128" for u in packed if u.op == "qlinear")
        experts_only = steps.with_weights(step, "", "mxfp4")
        assert [u.op for u in experts_only] == [u.op for u in step]  # the projections stay linear
    assert steps.with_weights(step, "", "") == step


def test_served_formats_of_the_presets():
    from phasebench.bench.spec.quant import ServedFormat, served_format

    assert served_format("gpt-oss-20b") == ServedFormat(experts="mxfp4")
    assert served_format("deepseek-v3").label == "projections and experts fp8-b128"
    assert served_format("llama-3-8b").label == "unquantized"
    with pytest.raises(ValueError, match="unknown scheme"):
        ServedFormat(experts="fp3")
