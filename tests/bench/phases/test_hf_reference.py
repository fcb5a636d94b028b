"""transformers' Llama as a second reference: the same dims as phasebench's decoder, the same math given the same
weights (float64), repeatable steps on its static cache, and a one-line error where it is not installed."""

from __future__ import annotations

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


TINY_MOE = DecoderConfig(hidden=64, intermediate=40, layers=2, q_heads=4, kv_heads=2, head_dim=16, vocab=89,
                         name="tiny-moe-hf", experts=6, top_k=2)


def test_a_mixture_is_transformers_mixtral_and_matches_phasebench_decoder_in_float64():
    """The same weights in phasebench's MoE layer (router, kernels.moe's naive experts) and Mixtral's: the same hidden
    states (the routing weights are fp32 softmaxes in both) and the same tokens, prefill and decode."""
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


def test_shared_experts_have_no_transformers_reference():
    shared = DecoderConfig(**{**TINY_MOE.__dict__, "shared_intermediate": 32, "name": "tiny-shared"})
    with pytest.raises(ValueError, match="reference: tiny-shared has shared experts") as err:
        HFReference(shared, 1, "cpu", torch.float32)
    assert "\n" not in str(err.value)
