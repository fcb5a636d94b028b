"""transformers' Llama as a second reference: the same dims as phasebench's decoder, the same math given the same
weights (float64), repeatable steps on its static cache, and a one-line error where it is not installed."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys

import pytest
import torch
from phasebench.bench.phases.reference_decoder import ReferenceDecoder
from phasebench.bench.spec.models import DecoderConfig

from ...conftest import REPO

pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[reference]')")
from phasebench.bench.phases.hf_reference import HFReference  # noqa: E402

TINY = DecoderConfig(hidden=96, intermediate=200, layers=2, q_heads=6, kv_heads=2, head_dim=16, vocab=97,
                     name="tiny-hf")


def _copy_weights(ours: ReferenceDecoder, theirs: HFReference) -> None:
    """phasebench's fused projections split into Llama's q/k/v and gate/up."""
    c, d = TINY, TINY.head_dim
    model = theirs.model
    with torch.no_grad():
        for mine, layer in zip(ours.layers, model.model.layers, strict=True):
            q, k, v = mine.qkv.weight.split((c.q_heads * d, c.kv_heads * d, c.kv_heads * d))
            attn, mlp = layer.self_attn, layer.mlp
            for target, source in ((attn.q_proj, q), (attn.k_proj, k), (attn.v_proj, v), (attn.o_proj, mine.o.weight),
                                   (mlp.down_proj, mine.down.weight)):
                target.weight.copy_(source)
            gate, up = mine.gate_up.weight.split(c.intermediate)
            mlp.gate_proj.weight.copy_(gate)
            mlp.up_proj.weight.copy_(up)
            layer.input_layernorm.weight.copy_(mine.attn_norm.weight)
            layer.post_attention_layernorm.weight.copy_(mine.mlp_norm.weight)
        model.model.norm.weight.copy_(ours.final_norm.weight)
        model.lm_head.weight.copy_(ours.lm_head.weight)


@pytest.fixture(scope="module")
def pair():
    ours = ReferenceDecoder(TINY, 2, "cpu", torch.float64, max_tokens=40, max_batch=3, seed=5)
    theirs = HFReference(TINY, 2, "cpu", torch.float64)
    _copy_weights(ours, theirs)
    return ours, theirs


def test_the_same_dims_hold_the_same_parameters(pair):
    ours, theirs = pair
    embedding = theirs.model.model.embed_tokens.weight.numel()  # unused: both are fed hidden states
    assert sum(p.numel() for p in theirs.model.parameters()) - embedding == sum(p.numel() for p in ours.parameters())


def test_prefill_and_decode_agree_with_phasebench_decoder_in_float64(pair):
    ours, theirs = pair
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(3, 37, TINY.hidden, generator=gen, dtype=torch.float64)
    _, hidden = ours.prefill(3, 37, x=x, return_hidden=True)
    theirs._inputs = {(3, 37): x}
    with torch.inference_mode():
        out = theirs.model.model(inputs_embeds=x, use_cache=False)
    # transformers draws its rotary angles in float32 (phasebench's in float64): about 1e-7 apart; a rotary,
    # mask or head-grouping convention that differed would be O(1) off
    torch.testing.assert_close(out.last_hidden_state, ours.final_norm(hidden), rtol=1e-5, atol=1e-5)
    assert torch.equal(theirs.prefill(3, 37), ours.prefill(3, 37, x=x))
    # a decode step at position 37 after that prefill: the caches hold the same keys and values
    step = torch.randn(3, 1, TINY.hidden, generator=gen, dtype=torch.float64)
    theirs._inputs = {(3, 1): step}
    with torch.inference_mode():
        cache = theirs._cache(3, 38)
        for layer in getattr(cache, "layers", ()):
            if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor):
                layer.cumulative_length.fill_(0)
        positions = torch.arange(37)
        theirs.model(inputs_embeds=x, cache_position=positions, position_ids=positions.expand(3, -1),
                     use_cache=True, logits_to_keep=1, **{theirs._cache_kw: cache})
    assert torch.equal(theirs.decode_step(3, 37), ours.decode_step(3, 37, x=step))


def test_a_depth_runs_the_first_layers_as_phasebench_decoder_does(pair):
    """The per-layer check times L and 2L layers of one model: depth 1 of transformers' Llama equals phasebench's
    decoder at depth 1, and the model runs all its layers again after the call."""
    ours, theirs = pair
    gen = torch.Generator().manual_seed(17)
    x = torch.randn(2, 23, TINY.hidden, generator=gen, dtype=torch.float64)
    theirs._inputs = {(2, 23): x}
    calls = []
    hooks = [layer.register_forward_hook(lambda m, a, o, i=i: calls.append(i))
             for i, layer in enumerate(theirs.model.model.layers)]
    try:
        assert torch.equal(theirs.prefill(2, 23, depth=1), ours.prefill(2, 23, x=x, depth=1))
        assert calls == [0]
        theirs.prefill(2, 23)
        assert calls == [0, 0, 1] and theirs.config.num_hidden_layers == 2
    finally:
        for hook in hooks:
            hook.remove()
    with pytest.raises(ValueError, match="depth"):
        theirs.decode_step(2, 30, depth=3)


def test_repeated_steps_do_the_same_work_on_the_static_cache():
    model = HFReference(TINY, 1, "cpu", torch.float32)
    first = [model.decode_step(2, 30), model.prefill(1, 16)]
    again = [model.decode_step(2, 30), model.prefill(1, 16)]
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert model.name.startswith("transformers ") and "static cache" in model.name


def test_transformers_imports_from_a_clone_root_despite_the_kernels_folder():
    """From the repository's root `import kernels` finds phasebench's folder; transformers still imports."""
    code = ("import sys; sys.path.insert(0, '.'); import kernels; "
            "from phasebench.bench.phases.hf_reference import available; print(available())")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.stdout.strip() == "True", proc.stderr[-2000:]


# the top 3 of 7 experts: a softmax's top 3 sum well below 1, so that a router which did not renormalize fails
TINY_MOE = DecoderConfig(hidden=64, intermediate=40, layers=2, q_heads=4, kv_heads=2, head_dim=16, vocab=89,
                         name="tiny-moe-hf", experts=7, top_k=3)


def test_a_mixture_is_transformers_mixtral_and_matches_phasebench_decoder_in_float64():
    """The same weights in phasebench's MoE layer (router, kernels.moe's naive experts) and Mixtral's: the same hidden
    states (the routing weights are fp32 softmaxes in both, renormalized, which leaving out would break) and the same
    tokens, prefill and decode."""
    ours = ReferenceDecoder(TINY_MOE, 1, "cpu", torch.float64, max_tokens=40, max_batch=3, seed=3, moe_impl="naive")
    theirs = HFReference(TINY_MOE, 1, "cpu", torch.float64, experts="eager")  # torch._grouped_mm takes no float64
    assert type(theirs.model).__name__ == "MixtralForCausalLM" and "experts eager" in theirs.name
    c, d = TINY_MOE, TINY_MOE.head_dim
    with torch.no_grad():
        for mine, layer in zip(ours.layers, theirs.model.model.layers, strict=True):
            q, k, v = mine.qkv.weight.split((c.q_heads * d, c.kv_heads * d, c.kv_heads * d))
            attn, mlp = layer.self_attn, layer.mlp
            for target, source in ((attn.q_proj.weight, q), (attn.k_proj.weight, k), (attn.v_proj.weight, v),
                                   (attn.o_proj.weight, mine.o.weight), (mlp.gate.weight, mine.mixture.router.weight),
                                   (mlp.experts.gate_up_proj, mine.mixture.w_gate_up),
                                   (mlp.experts.down_proj, mine.mixture.w_down),
                                   (layer.input_layernorm.weight, mine.attn_norm.weight),
                                   (layer.post_attention_layernorm.weight, mine.mlp_norm.weight)):
                target.copy_(source)
        theirs.model.model.norm.weight.copy_(ours.final_norm.weight)
        theirs.model.lm_head.weight.copy_(ours.lm_head.weight)
    embedding = theirs.model.model.embed_tokens.weight.numel()
    assert sum(p.numel() for p in theirs.model.parameters()) - embedding == sum(p.numel() for p in ours.parameters())
    x = torch.randn(3, 13, c.hidden, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    _, hidden = ours.prefill(3, 13, x=x, return_hidden=True)
    with torch.inference_mode():
        out = theirs.model.model(inputs_embeds=x, use_cache=False)
    torch.testing.assert_close(out.last_hidden_state, ours.final_norm(hidden), rtol=1e-5, atol=1e-5)
    theirs._inputs = {(3, 13): x}
    assert torch.equal(theirs.prefill(3, 13), ours.prefill(3, 13, x=x))
    for layer in ours.layers:
        layer.mixture.routing["renormalize"] = False
    _, hidden = ours.prefill(3, 13, x=x, return_hidden=True)
    assert (out.last_hidden_state - ours.final_norm(hidden)).abs().max() > 1e-3  # 100 times the tolerance


def test_shared_experts_have_no_transformers_reference():
    shared = DecoderConfig(**{**TINY_MOE.__dict__, "shared_intermediate": 32, "name": "tiny-shared"})
    with pytest.raises(ValueError, match="reference: tiny-shared has shared experts") as err:
        HFReference(shared, 1, "cpu", torch.float32)
    assert "\n" not in str(err.value)


def _hidden_after_prefill_and_decode(theirs: HFReference, x: torch.Tensor, step: torch.Tensor):
    """transformers' last hidden states (after the final norm) of a prompt x, then of one decode token after it on
    the same static cache."""
    batch, prompt = x.shape[:2]
    out = []
    with torch.inference_mode():
        cache = theirs._cache(batch, prompt + 1)
        for tokens, start in ((x, 0), (step, prompt)):
            for layer in getattr(cache, "layers", ()):
                if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor):
                    layer.cumulative_length.fill_(start)
                if hasattr(layer, "cumulative_length_int"):
                    layer.cumulative_length_int = start
            positions = torch.arange(start, start + tokens.shape[1])
            out.append(theirs.model.model(inputs_embeds=tokens, cache_position=positions, use_cache=True,
                                          position_ids=positions.expand(batch, -1),
                                          **{theirs._cache_kw: cache}).last_hidden_state)
    return out


def _rope_pairs_to_halves(weight: torch.Tensor, heads: int, head: int, rope: int) -> torch.Tensor:
    """Rows of a projection whose heads end in `rope` rotary dims, those dims taken from DeepSeek's interleaved pairs
    (2i, 2i+1) to the rotate-half order (i, i + rope/2) phasebench's rotary uses: the same dot products."""
    order = torch.cat((torch.arange(0, rope, 2), torch.arange(1, rope, 2))) + head - rope
    index = torch.cat([torch.cat((torch.arange(head - rope), order)) + h * head for h in range(heads)])
    return weight[index]


# an MLA mixture at awkward dims, the top 3 of 7 experts, a first dense layer, shared experts and a q_lora
# projection, routed as DeepSeek-V2 does (a softmax's top k as it is, scaled by 1.0 in V2-Lite) and as DeepSeek-V3
# does (a sigmoid's top k renormalized, times 2.5; its group limit left out on both sides)
TINY_MLA = DecoderConfig(hidden=96, intermediate=24, layers=3, q_heads=3, kv_heads=3, head_dim=10, vocab=67,
                         name="tiny-mla-hf", experts=7, top_k=3, shared_intermediate=48, dense_layers=1,
                         dense_intermediate=40, kv_lora_rank=14, qk_rope_head_dim=6, qk_nope_head_dim=12,
                         q_lora_rank=22, router_renormalize=False)
TINY_MLA_V3 = dataclasses.replace(TINY_MLA, name="tiny-mla-v3-hf", router_scoring="sigmoid", router_renormalize=True,
                                  router_scale=2.5)


@pytest.mark.parametrize("c, model", [(TINY_MLA, "DeepseekV2ForCausalLM"), (TINY_MLA_V3, "DeepseekV3ForCausalLM")])
def test_mla_matches_transformers_deepseek_in_float64_prefill_decompressed_and_decode_absorbed(c, model):
    """The same weights in phasebench's MLA decoder and DeepseekV2 (or V3): the prompt's hidden states (decompressed
    K/V per head), then a decode step's, which phasebench absorbs into the latent (kernels.mla_decode) where
    transformers decompresses the whole cache: the same math, two ways; the router's too, which the other
    renormalizing would break."""
    h = c.q_heads
    ours = ReferenceDecoder(c, 3, "cpu", torch.float64, max_tokens=40, max_batch=2, seed=4, moe_impl="naive",
                            impls={"mla": "naive"})
    theirs = HFReference(c, 3, "cpu", torch.float64, experts="eager")
    assert type(theirs.model).__name__ == model
    with torch.no_grad():
        for mine, layer in zip(ours.layers, theirs.model.model.layers, strict=True):
            attn, block = layer.self_attn, mine.mla
            kv_a = attn.kv_a_proj_with_mqa.weight
            rope_rows = _rope_pairs_to_halves(kv_a[c.kv_lora_rank:], 1, c.qk_rope_head_dim, c.qk_rope_head_dim)
            block.q_kv_a.weight.copy_(torch.cat((attn.q_a_proj.weight, kv_a[:c.kv_lora_rank], rope_rows)))
            block.q_b.weight.copy_(_rope_pairs_to_halves(attn.q_b_proj.weight, h, c.qk_head_dim, c.qk_rope_head_dim))
            for target, source in ((block.q_norm.weight, attn.q_a_layernorm.weight),
                                   (block.kv_norm.weight, attn.kv_a_layernorm.weight),
                                   (block.kv_b.weight, attn.kv_b_proj.weight), (block.o.weight, attn.o_proj.weight),
                                   (mine.attn_norm.weight, layer.input_layernorm.weight),
                                   (mine.mlp_norm.weight, layer.post_attention_layernorm.weight)):
                target.copy_(source)
            mlp = layer.mlp
            if mine.mixture is None:
                mine.dense_gate_up.weight.copy_(torch.cat((mlp.gate_proj.weight, mlp.up_proj.weight)))
                mine.dense_down.weight.copy_(mlp.down_proj.weight)
                continue
            shared, moe = mlp.shared_experts, mine.mixture
            assert not getattr(mlp.gate, "e_score_correction_bias", torch.zeros(1)).any()
            for target, source in ((moe.router.weight, mlp.gate.weight), (moe.w_gate_up, mlp.experts.gate_up_proj),
                                   (moe.w_down, mlp.experts.down_proj), (moe.down.weight, shared.down_proj.weight),
                                   (moe.gate_up.weight, torch.cat((shared.gate_proj.weight, shared.up_proj.weight)))):
                target.copy_(source)
        ours.final_norm.weight.copy_(theirs.model.model.norm.weight)
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(2, 17, c.hidden, generator=gen, dtype=torch.float64)
    step = torch.randn(2, 1, c.hidden, generator=gen, dtype=torch.float64)
    prompt, decoded = _hidden_after_prefill_and_decode(theirs, x, step)
    _, hidden = ours.prefill(2, 17, x=x, return_hidden=True)
    # transformers routes in float32 and draws its rotary angles in float32: about 1e-7 apart
    torch.testing.assert_close(prompt, ours.final_norm(hidden), rtol=1e-5, atol=1e-5)
    _, hidden = ours.decode_step(2, 17, x=step, return_hidden=True)
    torch.testing.assert_close(decoded, ours.final_norm(hidden), rtol=1e-5, atol=1e-5)
    for layer in ours.layers[c.dense_layers:]:
        layer.mixture.routing["renormalize"] = not c.router_renormalize
    _, hidden = ours.prefill(2, 17, x=x, return_hidden=True)
    assert (prompt - ours.final_norm(hidden)).abs().max() > 1e-3  # 100 times the tolerance


# a gpt-oss-like model: window layers (window 5) alternating with full ones, sinks, 6 query heads on 2 kv heads
TINY_OSS = DecoderConfig(hidden=64, intermediate=24, layers=3, q_heads=6, kv_heads=2, head_dim=8, vocab=67,
                         name="tiny-oss-hf", experts=3, top_k=2, sliding_window=5, sinks=True)


def test_window_and_sink_attention_matches_transformers_gpt_oss_in_float64():
    """The same attention weights and sinks in phasebench's window and full layers (kernels.attention, naive) and
    GptOss's (eager), the experts zeroed on both sides (GptOss's clamped SwiGLU with biases is not phasebench's
    MoE): the hidden states of a prompt longer than the window, and of a decode step after it."""
    c = TINY_OSS
    ours = ReferenceDecoder(c, 3, "cpu", torch.float64, max_tokens=40, max_batch=2, seed=6, moe_impl="naive",
                            impls={"attention": "naive"})
    theirs = HFReference(c, 3, "cpu", torch.float64, experts="eager")
    assert type(theirs.model).__name__ == "GptOssForCausalLM" and "(eager" in theirs.name
    d = c.head_dim
    with torch.no_grad():
        for mine, layer in zip(ours.layers, theirs.model.model.layers, strict=True):
            attn = layer.self_attn
            assert (mine.attention.window_left >= 0) == (attn.sliding_window is not None)
            q, k, v = mine.qkv.weight.split((c.q_heads * d, c.kv_heads * d, c.kv_heads * d))
            for target, source in ((attn.q_proj.weight, q), (attn.k_proj.weight, k), (attn.v_proj.weight, v),
                                   (attn.o_proj.weight, mine.o.weight), (attn.sinks, mine.attention.sinks),
                                   (layer.input_layernorm.weight, mine.attn_norm.weight),
                                   (layer.post_attention_layernorm.weight, mine.mlp_norm.weight)):
                target.copy_(source)
            for bias in (attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias, attn.o_proj.bias):
                bias.zero_()
            for tensor in (layer.mlp.experts.gate_up_proj, layer.mlp.experts.gate_up_proj_bias,
                           layer.mlp.experts.down_proj, layer.mlp.experts.down_proj_bias, mine.mixture.w_gate_up,
                           mine.mixture.w_down):
                tensor.zero_()
        theirs.model.model.norm.weight.copy_(ours.final_norm.weight)
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(2, 13, c.hidden, generator=gen, dtype=torch.float64)
    step = torch.randn(2, 1, c.hidden, generator=gen, dtype=torch.float64)
    prompt, decoded = _hidden_after_prefill_and_decode(theirs, x, step)
    _, hidden = ours.prefill(2, 13, x=x, return_hidden=True)
    # GptOss's norms compute in float32: about 1e-7 apart; a window one key off, or a sink left out, is O(1e-2)
    torch.testing.assert_close(prompt, ours.final_norm(hidden), rtol=1e-5, atol=1e-5)
    _, hidden = ours.decode_step(2, 13, x=step, return_hidden=True)
    torch.testing.assert_close(decoded, ours.final_norm(hidden), rtol=1e-5, atol=1e-5)


def test_kinds_transformers_has_no_class_for_are_one_line():
    from phasebench.bench.phases.hf_reference import architecture, transformers_module

    dense_window = DecoderConfig(**{**TINY_OSS.__dict__, "experts": 0, "top_k": 0, "name": "dense-window"})
    odd_shared = DecoderConfig(**{**TINY_MLA.__dict__, "shared_intermediate": 30, "name": "odd-shared"})
    renormalized = dataclasses.replace(TINY_MLA, name="mla-renormalized", router_renormalize=True)
    scaled = dataclasses.replace(TINY_MOE, name="moe-scaled", router_scale=2.5)
    for config, message in ((dense_window, "reference: dense-window is not a gpt-oss layer"),
                            (odd_shared, "reference: odd-shared's shared experts (30) are not a whole number"),
                            (renormalized, "reference: mla-renormalized renormalizes its router's softmax top k"),
                            (scaled, "reference: moe-scaled's router is not a softmax's top k renormalized")):
        with pytest.raises(ValueError, match=re.escape(message)) as err:
            architecture(transformers_module(), config)
        assert "\n" not in str(err.value)
