"""The model presets against their published config.json, what their attention kind implies (MLA's latent, gpt-oss's
window layers, the KV bytes a token costs), the weights they add up to, their routers, and one-line errors for bad
input."""

from __future__ import annotations

import dataclasses

import pytest
from phasebench.bench.spec.models import (
    MODELS,
    DecoderConfig,
    config_from_dict,
    kind_config,
    model_weight_count,
    models_of_kind,
    parse_model,
)

# Transcribed from each model's config.json on Hugging Face (docs/attention-kinds.md cites them): the published keys,
# mapped to DecoderConfig by the rules of bench/spec/models.py.
PUBLISHED = {
    "deepseek-v2-lite": dict(hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408,
                             num_hidden_layers=27, num_attention_heads=16, v_head_dim=128, vocab_size=102400,
                             n_routed_experts=64, num_experts_per_tok=6, n_shared_experts=2, first_k_dense_replace=1,
                             kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, q_lora_rank=None),
    "deepseek-v3": dict(hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048, num_hidden_layers=61,
                        num_attention_heads=128, v_head_dim=128, vocab_size=129280, n_routed_experts=256,
                        num_experts_per_tok=8, n_shared_experts=1, first_k_dense_replace=3, kv_lora_rank=512,
                        qk_rope_head_dim=64, qk_nope_head_dim=128, q_lora_rank=1536),
    "gpt-oss-20b": dict(hidden_size=2880, intermediate_size=2880, num_hidden_layers=24, num_attention_heads=64,
                        num_key_value_heads=8, head_dim=64, vocab_size=201088, num_local_experts=32,
                        num_experts_per_tok=4, sliding_window=128),
    "gpt-oss-120b": dict(hidden_size=2880, intermediate_size=2880, num_hidden_layers=36, num_attention_heads=64,
                         num_key_value_heads=8, head_dim=64, vocab_size=201088, num_local_experts=128,
                         num_experts_per_tok=4, sliding_window=128),
}
# each mixture's router as its config.json or reference code has it (scoring_func, norm_topk_prob,
# routed_scaling_factor): DeepSeek's config.json files (V2-Lite: softmax, greedy top k, false, 1.0; V3: sigmoid,
# noaux_tc, true, 2.5), Qwen3-30B-A3B's (norm_topk_prob true), Mixtral's and gpt-oss's reference code (a softmax over
# the top k logits: the top k of a softmax, renormalized)
ROUTERS = {"deepseek-v2-lite": ("softmax", False, 1.0), "deepseek-v3": ("sigmoid", True, 2.5),
           "qwen3-30b-a3b": ("softmax", True, 1.0), "mixtral-8x7b": ("softmax", True, 1.0),
           "gpt-oss-20b": ("softmax", True, 1.0), "gpt-oss-120b": ("softmax", True, 1.0)}
# the models' published totals, in billions (model cards: 15.7B, 671B without the MTP module, 21B and 117B)
TOTALS = {"deepseek-v2-lite": 15.7, "deepseek-v3": 671, "gpt-oss-20b": 20.9, "gpt-oss-120b": 116.8}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_each_preset_holds_its_published_config(name):
    m, c = MODELS[name], PUBLISHED[name]
    assert (m.hidden, m.layers, m.q_heads, m.vocab) == (c["hidden_size"], c["num_hidden_layers"],
                                                       c["num_attention_heads"], c["vocab_size"])
    if name.startswith("deepseek"):
        assert m.attention == "mla" and not m.sinks
        assert (m.intermediate, m.dense_intermediate, m.dense_layers) == (
            c["moe_intermediate_size"], c["intermediate_size"], c["first_k_dense_replace"])
        assert (m.experts, m.top_k, m.shared_intermediate) == (
            c["n_routed_experts"], c["num_experts_per_tok"], c["n_shared_experts"] * c["moe_intermediate_size"])
        assert (m.kv_lora_rank, m.qk_rope_head_dim, m.qk_nope_head_dim, m.head_dim, m.q_lora_rank or None) == (
            c["kv_lora_rank"], c["qk_rope_head_dim"], c["qk_nope_head_dim"], c["v_head_dim"], c["q_lora_rank"])
    else:
        assert m.attention == "window" and m.sinks and not m.dense_layers and not m.shared_intermediate
        assert (m.intermediate, m.kv_heads, m.head_dim, m.experts, m.top_k, m.sliding_window) == (
            c["intermediate_size"], c["num_key_value_heads"], c["head_dim"], c["num_local_experts"],
            c["num_experts_per_tok"], c["sliding_window"])
    # the embedding (vocab x hidden, not in model_weight_count) brings each to its published total
    total = (model_weight_count(m) + m.vocab * m.hidden) / 1e9
    assert total == pytest.approx(TOTALS[name], rel=0.01)


def test_each_mixture_routes_as_its_config_says():
    assert {name for name, m in MODELS.items() if m.is_moe} == set(ROUTERS)
    for name, router in ROUTERS.items():
        m = MODELS[name]
        assert (m.router_scoring, m.router_renormalize, m.router_scale) == router, name


def test_a_custom_spec_carries_its_router_and_a_bad_one_is_one_line():
    spec = ("name=tiny-router-spec,hidden=64,intermediate=24,layers=3,q_heads=6,kv_heads=2,head_dim=8,vocab=67,"
            "experts=7,top_k=3")
    plain = parse_model(spec)
    assert (plain.router_scoring, plain.router_renormalize, plain.router_scale) == ("softmax", True, 1.0)
    custom = parse_model(spec + ",router_scoring=sigmoid,router_renormalize=false,router_scale=2.5")
    assert (custom.router_scoring, custom.router_renormalize, custom.router_scale) == ("sigmoid", False, 2.5)
    assert config_from_dict(dataclasses.asdict(custom)) == custom
    old = {k: v for k, v in dataclasses.asdict(plain).items() if not k.startswith("router_")}  # an older phases.json
    assert config_from_dict(old) == plain
    for extra, message in ((",router_scoring=relu", "^router_scoring: must be one of softmax, sigmoid, got 'relu'"),
                           (",router_renormalize=2", "^model: router_renormalize must be 0/1/true/false, got '2'"),
                           (",router_scale=fast", "^model: router_scale must be a number, got 'fast'"),
                           (",router_scale=0", "^router_scale: must be a positive finite number, got 0.0"),
                           (",router_scale=inf", "^router_scale: must be a positive finite number, got inf")):
        with pytest.raises(ValueError, match=message) as err:
            parse_model(spec + extra)
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="^router_renormalize: must be a bool, got 1"):
        DecoderConfig(**BASE, experts=7, top_k=3, router_renormalize=1)


def test_mla_presets_cache_one_576_wide_latent_and_keep_the_query_heads_scale():
    lite, v3 = MODELS["deepseek-v2-lite"], MODELS["deepseek-v3"]
    for m in (lite, v3):
        assert (m.latent_dim, m.qk_head_dim, m.softmax_scale) == (576, 192, 192 ** -0.5)
        assert m.kv_bytes_per_token(2, 4096) == m.layers * 576 * 2  # whatever the context
    assert lite.layer_groups() == {("dense", "full"): 1, ("moe", "full"): 26}
    assert v3.layer_groups(5) == {("dense", "full"): 3, ("moe", "full"): 2}
    assert lite.projections()["q_kv_a"] == (16 * 192 + 576, 2048) and "q_b" not in lite.projections()
    assert v3.projections()["q_kv_a"] == (1536 + 576, 7168) and v3.projections()["q_b"] == (128 * 192, 1536)
    assert lite.projections()["kv_b"] == (16 * (128 + 128), 512)
    # the absorbed projections have kv_b's weights, split by heads: counted once
    absorbed = lite.projections()["q_absorb"][0] * 128 + lite.projections()["v_up"][0] * 512
    assert absorbed == 16 * 256 * 512


def test_gpt_oss_alternates_window_and_full_layers_and_its_window_layers_keep_128_tokens():
    small, large = MODELS["gpt-oss-20b"], MODELS["gpt-oss-120b"]
    for m in (small, large):
        assert (m.window_left, m.window_layers, m.layer_kind(0), m.layer_kind(1)) == (
            127, m.layers // 2, ("moe", "window"), ("moe", "full"))
    per_layer = 2 * 8 * 64 * 2
    assert small.kv_bytes_per_token(2, 128) == 24 * per_layer
    assert small.kv_bytes_per_token(2, 8192) == per_layer * (12 + 12 * 128 / 8192)
    assert MODELS["llama-3-8b"].kv_bytes_per_token(2, 8192) == 32 * 2 * 8 * 128 * 2
    assert set(models_of_kind("mla")) >= {"deepseek-v2-lite", "deepseek-v3"}
    assert set(models_of_kind("window")) >= {"gpt-oss-20b", "gpt-oss-120b"}


def test_a_custom_spec_names_its_attention_kind():
    mla = parse_model("name=tiny-mla-spec,hidden=96,intermediate=24,layers=3,q_heads=3,kv_heads=3,head_dim=10,"
                      "vocab=67,experts=5,top_k=2,dense_layers=1,dense_intermediate=40,kv_lora_rank=14,"
                      "qk_rope_head_dim=6,qk_nope_head_dim=12")
    assert (mla.attention, mla.latent_dim, mla.layer_groups()) == ("mla", 20, {("dense", "full"): 1,
                                                                              ("moe", "full"): 2})
    window = parse_model("name=tiny-window-spec,hidden=64,intermediate=24,layers=3,q_heads=6,kv_heads=2,head_dim=8,"
                         "vocab=67,sliding_window=5,sinks=1")
    assert (window.attention, window.sinks, window.window_layers, window.window_left) == ("window", True, 2, 4)
    assert kind_config("gpt-oss-20b", "window") is MODELS["gpt-oss-20b"]


BASE = dict(hidden=64, intermediate=24, layers=3, q_heads=6, kv_heads=2, head_dim=8, vocab=67)


@pytest.mark.parametrize(("fields", "message"), [
    (dict(kv_lora_rank=14), "^kv_lora_rank: MLA needs kv_lora_rank, qk_rope_head_dim and qk_nope_head_dim"),
    (dict(kv_lora_rank=13, qk_rope_head_dim=6, qk_nope_head_dim=12), "^qk_rope_head_dim: MLA's rotary dims"),
    (dict(kv_lora_rank=14, qk_rope_head_dim=6, qk_nope_head_dim=12, sliding_window=5),
     "^sliding_window: an MLA model attends its whole latent cache"),
    (dict(dense_layers=1, dense_intermediate=40), "^dense_layers: a mixture's first dense layers need"),
    (dict(experts=4, top_k=2, dense_layers=1), "^dense_layers: "),
    (dict(sliding_window=-1), "^sliding_window: must be a non-negative int"),
    (dict(sinks=1), "^sinks: must be a bool"),
])
def test_bad_attention_fields_are_one_line(fields, message):
    with pytest.raises(ValueError, match=message) as err:
        DecoderConfig(**BASE, **fields)
    assert "\n" not in str(err.value)


def test_a_model_of_the_other_kind_and_a_bad_sinks_value_are_one_line():
    with pytest.raises(ValueError, match="^model: 'gpt-oss-20b' has WINDOW attention, not MLA .*deepseek-v2-lite"):
        kind_config("gpt-oss-20b", "mla")
    with pytest.raises(ValueError, match="^model: 'llama-3-8b' has GQA attention, not WINDOW"):
        kind_config("llama-3-8b", "window")
    with pytest.raises(ValueError, match="^model: sinks must be 0/1/true/false, got 'maybe'"):
        parse_model("name=bad-sinks,hidden=64,intermediate=24,layers=3,q_heads=6,kv_heads=2,head_dim=8,vocab=67,"
                    "sinks=maybe")
