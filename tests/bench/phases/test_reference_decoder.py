"""The reference decoder against a step-by-step float64 computation, its KV cache, its traced ops and timers."""

from __future__ import annotations

import math

import pytest
import torch
from phasebench.bench.instruments.timing import TimerConfig
from phasebench.bench.phases import reference_decoder as rd
from phasebench.bench.phases.reference_decoder import (
    ReferenceDecoder,
    ops_of_decode,
    ops_of_prefill,
    time_decode_step,
    time_prefill,
)
from phasebench.bench.spec.models import MODELS, DecoderConfig

TINY = DecoderConfig(hidden=96, intermediate=200, layers=2, q_heads=6, kv_heads=2, head_dim=16, vocab=97,
                     name="tiny-ref")
QUICK = TimerConfig(warmup_s=0.0, budget_s=0.0, min_samples=3, max_samples=3)


def _inputs(batch, tokens, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, tokens, TINY.hidden, generator=gen, dtype=torch.float64)


def _norm(x, w):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w


def _rope(x, positions):
    """x [T, D] at the given positions, each pair (i, i + D/2) rotated by pos * 500000^(-2i/D)."""
    d = x.shape[-1]
    half = d // 2
    out = torch.empty_like(x)
    for t, pos in enumerate(positions):
        for i in range(half):
            angle = pos * 500000.0 ** (-2 * i / d)
            c, s = math.cos(angle), math.sin(angle)
            a, b = x[t, i], x[t, i + half]
            out[t, i], out[t, i + half] = a * c - b * s, b * c + a * s
    return out


def _reference_layer(layer, x, start, cached_k=None, cached_v=None):
    """One layer over one sequence x [T, hidden] at positions start.., attending to cached rows (each [Hkv, start, D])
    and to itself, with explicit matmuls and a masked softmax. Returns the output and the new roped k, v."""
    t, (hq, hkv, d) = x.shape[0], (TINY.q_heads, TINY.kv_heads, TINY.head_dim)
    positions = range(start, start + t)
    qkv = _norm(x, layer.attn_norm.weight) @ layer.qkv.weight.T
    q = qkv[:, :hq * d].reshape(t, hq, d)
    k = qkv[:, hq * d:(hq + hkv) * d].reshape(t, hkv, d)
    v = qkv[:, (hq + hkv) * d:].reshape(t, hkv, d)
    new_k = torch.stack([_rope(k[:, h], positions) for h in range(hkv)])
    new_v = v.transpose(0, 1)
    keys = new_k if cached_k is None else torch.cat([cached_k, new_k], dim=1)
    values = new_v if cached_v is None else torch.cat([cached_v, new_v], dim=1)
    s = keys.shape[1]
    heads = []
    for h in range(hq):
        kv = h // (hq // hkv)
        scores = _rope(q[:, h], positions) @ keys[kv].T / math.sqrt(d)
        mask = torch.arange(s)[None, :] > torch.arange(start, start + t)[:, None]
        scores = scores.masked_fill(mask, float("-inf"))
        heads.append(torch.softmax(scores, dim=-1) @ values[kv])
    x = x + torch.cat(heads, dim=-1) @ layer.o.weight.T
    gu = _norm(x, layer.mlp_norm.weight) @ layer.gate_up.weight.T
    gate, up = gu[:, :TINY.intermediate], gu[:, TINY.intermediate:]
    return x + (gate * torch.sigmoid(gate) * up) @ layer.down.weight.T, new_k, new_v


def _reference_ids(decoder, last):
    return (_norm(last, decoder.final_norm.weight) @ decoder.lm_head.weight.T).argmax(-1)


def _decoder(dtype=torch.float64, device="cpu", seed=3, max_tokens=24, max_batch=3):
    return ReferenceDecoder(TINY, 2, device, dtype, max_tokens=max_tokens, max_batch=max_batch, seed=seed)


def test_prefill_matches_a_step_by_step_float64_computation():
    decoder = _decoder()
    x = _inputs(3, 11, seed=7)
    ids, hidden = decoder.prefill(3, 11, x=x, return_hidden=True)
    for b in range(3):
        h = x[b]
        for layer in decoder.layers:
            h, k, v = _reference_layer(layer, h, 0)
            torch.testing.assert_close(layer.k_cache[b, :, :11], k, rtol=0, atol=1e-10)
            torch.testing.assert_close(layer.v_cache[b, :, :11], v, rtol=0, atol=1e-10)
        torch.testing.assert_close(hidden[b], h, rtol=0, atol=1e-10)
        assert ids[b].item() == _reference_ids(decoder, h[-1]).item()
    assert hidden.abs().max() < 50  # weights of std K**-0.5 keep activations of order one


def test_decode_after_prefill_equals_a_longer_prefill():
    decoder = _decoder()
    x = _inputs(2, 14, seed=11)
    ids_long, long = decoder.prefill(2, 14, x=x, return_hidden=True)
    decoder.prefill(2, 13, x=x[:, :13])
    ids, step = decoder.decode_step(2, 13, x=x[:, 13:], return_hidden=True)
    assert step.shape == (2, 1, TINY.hidden)
    torch.testing.assert_close(step[:, 0], long[:, -1], rtol=0, atol=1e-10)
    assert torch.equal(ids, ids_long)


def test_chunks_at_prefix_offsets_equal_one_prefill():
    """A prompt in chunks of awkward sizes (5, 1, 7 tokens) attends bottom-right causally to its prefix: the same
    hidden states, cache rows and ids as the whole prompt in one pass; every_position gives the head on each token."""
    decoder = _decoder()
    x = _inputs(2, 13, seed=17)
    ids_whole, whole = decoder.prefill(2, 13, x=x, return_hidden=True)
    k_whole = decoder.layers[1].k_cache[:2, :, :13].clone()
    parts = []
    for start, tokens in ((0, 5), (5, 1), (6, 7)):
        ids, hidden = decoder.extend(2, start, tokens, x=x[:, start:start + tokens], return_hidden=True)
        parts.append(hidden)
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, rtol=0, atol=1e-10)
    torch.testing.assert_close(decoder.layers[1].k_cache[:2, :, :13], k_whole, rtol=0, atol=1e-10)
    assert torch.equal(ids, ids_whole)
    every = decoder.extend(2, 6, 7, x=x[:, 6:], every_position=True)
    assert every.shape == (2, 7)
    for b in range(2):
        for i in range(7):
            assert every[b, i].item() == _reference_ids(decoder, whole[b, 6 + i]).item()
    for call, word in [(lambda: decoder.extend(2, -1, 3), "start"), (lambda: decoder.extend(2, 3, 0), "tokens"),
                       (lambda: decoder.extend(2, 30, 3), "start"), (lambda: decoder.extend(2, 2, 3, x=x), "x")]:
        with pytest.raises(ValueError, match=word):
            call()


def test_a_depth_runs_only_the_first_layers_then_the_head():
    """The per-layer check times L and 2L layers of one decoder: depth 1 is the first layer alone, the head after it."""
    decoder = _decoder()
    x = _inputs(2, 9, seed=13)
    ids, hidden = decoder.prefill(2, 9, x=x, return_hidden=True, depth=1)
    for b in range(2):
        h, k, _ = _reference_layer(decoder.layers[0], x[b], 0)
        torch.testing.assert_close(hidden[b], h, rtol=0, atol=1e-10)
        torch.testing.assert_close(decoder.layers[0].k_cache[b, :, :9], k, rtol=0, atol=1e-10)
        assert ids[b].item() == _reference_ids(decoder, h[-1]).item()
    step = _inputs(2, 1, seed=14)
    _, one = decoder.decode_step(2, 9, x=step, return_hidden=True, depth=1)
    _, both = decoder.decode_step(2, 9, x=step, return_hidden=True, depth=2)
    _, full = decoder.decode_step(2, 9, x=step, return_hidden=True)
    assert torch.equal(both, full) and not torch.allclose(one, both)
    for bad in (-1, 3, True, 1.0):  # 0 is the head alone: the check's zero-layer pass
        with pytest.raises(ValueError, match="depth"):
            decoder.decode_step(2, 9, depth=bad)


def test_decode_without_prefill_attends_to_the_seeded_random_cache():
    decoder = _decoder(seed=5)
    x = _inputs(3, 1, seed=13)
    ids, hidden = decoder.decode_step(3, 9, x=x, return_hidden=True)
    for b in range(3):
        h = x[b]
        for layer in decoder.layers:
            cached_k, cached_v = layer.k_cache[b, :, :9], layer.v_cache[b, :, :9]
            assert cached_k.abs().sum() > 0 and cached_k.std() > 0.5  # random values, not zeros nor garbage
            h, k, v = _reference_layer(layer, h, 9, cached_k, cached_v)
            torch.testing.assert_close(layer.k_cache[b, :, 9:10], k, rtol=0, atol=1e-10)
        torch.testing.assert_close(hidden[b], h, rtol=0, atol=1e-10)
        assert ids[b].item() == _reference_ids(decoder, h[-1]).item()
    again = _decoder(seed=5).decode_step(3, 9, x=x, return_hidden=True)[1]
    torch.testing.assert_close(again, hidden, rtol=0, atol=0)  # the cache fill is seeded


def _expected_layer_ops(m, batch, q_len, kv_len, causal):
    c = TINY
    return [
        {"op": "linear", "name": "qkv", "scope": "layer", "m": m, "n": (c.q_heads + 2 * c.kv_heads) * c.head_dim,
         "k": c.hidden},
        {"op": "attention", "name": "attention", "scope": "layer", "batch": batch, "q_heads": c.q_heads,
         "kv_heads": c.kv_heads, "q_len": q_len, "kv_len": kv_len, "head_dim": c.head_dim, "causal": causal,
         "page_size": 0},
        {"op": "linear", "name": "o", "scope": "layer", "m": m, "n": c.hidden, "k": c.q_heads * c.head_dim},
        {"op": "linear", "name": "gate_up", "scope": "layer", "m": m, "n": 2 * c.intermediate, "k": c.hidden},
        {"op": "linear", "name": "down", "scope": "layer", "m": m, "n": c.hidden, "k": c.intermediate},
    ]


def _expected_step_ops(rows):
    return [{"op": "linear", "name": "lm_head", "scope": "step", "m": rows, "n": TINY.vocab, "k": TINY.hidden},
            {"op": "argmax", "name": "greedy", "scope": "step", "m": rows, "n": TINY.vocab}]


def test_ops_of_prefill_and_decode_list_each_projection_attention_and_the_step():
    assert ops_of_prefill(TINY, 3, 11) == _expected_layer_ops(33, 3, 11, 11, True) + _expected_step_ops(3)
    assert ops_of_decode(TINY, 5, 13) == _expected_layer_ops(5, 5, 1, 14, False) + _expected_step_ops(5)


def test_recorded_ops_of_a_real_decoder_repeat_per_layer():
    decoder = _decoder(dtype=torch.float32)
    with decoder.record_ops() as ops:
        decoder.prefill(2, 7)
    assert ops == 2 * _expected_layer_ops(14, 2, 7, 7, True) + _expected_step_ops(2)
    decoder.decode_step(2, 7)
    assert len(ops) == 2 * 5 + 2  # the hooks are gone once the block closes


def test_traced_projections_of_a_preset_agree_with_its_config():
    config = MODELS["llama-3-8b"]
    traced = {op["name"]: (op["n"], op["k"]) for op in ops_of_decode(config, 4, 300) if op["op"] == "linear"}
    assert traced == config.projections()


def test_byte_counts_agree_with_the_allocated_decoder():
    decoder = _decoder(dtype=torch.float32, max_tokens=19, max_batch=2)
    assert decoder.weight_bytes() == rd.weight_bytes(TINY, 2, torch.float32)
    assert decoder.cache_bytes() == rd.cache_bytes(TINY, 2, 2, 19, torch.float32)
    config = MODELS["llama-3-8b"]
    layer_gib = 2 * config.layer_weight_count() * 4 / 2**30
    assert 1.5 < layer_gib < 1.8  # HOST_LAYERS of llama-3-8b fit a 24 GiB host beside the lm_head


def test_bad_input_raises_one_line_value_errors():
    decoder = _decoder(max_tokens=10, max_batch=2)
    for call, word in [(lambda: decoder.prefill(3, 4), "batch"), (lambda: decoder.prefill(2, 11), "prompt_len"),
                       (lambda: decoder.prefill(2, 0), "prompt_len"), (lambda: decoder.decode_step(1, 10), "context"),
                       (lambda: decoder.prefill(2, 4, x=_inputs(2, 5, 0)), "x"),
                       (lambda: ReferenceDecoder(TINY, 3, "cpu", torch.float32, 8, 1), "layers"),
                       (lambda: ReferenceDecoder(TINY, 1, "cpu", torch.int32, 8, 1), "dtype")]:
        with pytest.raises(ValueError, match=word) as info:
            call()
        assert "\n" not in str(info.value)


def test_timers_return_positive_medians():
    decoder = _decoder(dtype=torch.float32)
    for timing in (time_prefill(decoder, 2, 9, QUICK), time_decode_step(decoder, 3, 17, QUICK)):
        assert timing.count == 3 and timing.median_ms > 0 and timing.method == "perf_counter_ns"


def _bf16_against_float64(device):
    lo, hi = _decoder(torch.bfloat16, device), _decoder(torch.float64, device)
    x = _inputs(3, 12, seed=17).to(device)
    ids, hidden = lo.prefill(3, 12, x=x.to(torch.bfloat16), return_hidden=True)
    exact = hi.prefill(3, 12, x=x, return_hidden=True)[1]
    assert ids.shape == (3,) and ((0 <= ids) & (ids < TINY.vocab)).all()
    assert hidden.dtype == torch.bfloat16 and torch.isfinite(hidden).all()
    assert (hidden.double() - exact).norm() / exact.norm() < 0.05  # the same draw, rounded to bf16
    step_ids = lo.decode_step(3, 20)
    assert step_ids.shape == (3,) and ((0 <= step_ids) & (step_ids < TINY.vocab)).all()


def test_bf16_runs_and_stays_near_float64_on_the_host():
    _bf16_against_float64("cpu")


@pytest.mark.cuda
def test_bf16_runs_and_stays_near_float64_on_cuda():
    _bf16_against_float64("cuda")


@pytest.mark.cuda
def test_cuda_prefill_matches_the_host_and_times_with_events():
    x = _inputs(2, 10, seed=19)
    host_decoder, gpu_decoder = _decoder(), _decoder(device="cuda")
    gpu_decoder.load_state_dict(host_decoder.state_dict())  # CUDA's generator draws other weights
    host = host_decoder.prefill(2, 10, x=x, return_hidden=True)[1]
    gpu = gpu_decoder.prefill(2, 10, x=x.cuda(), return_hidden=True)[1]
    torch.testing.assert_close(gpu.cpu(), host, rtol=0, atol=1e-10)
    decoder = _decoder(torch.bfloat16, "cuda")
    assert time_prefill(decoder, 2, 10, QUICK).method == "cuda-events"
    assert time_decode_step(decoder, 2, 10, QUICK).median_ms > 0


@pytest.mark.parametrize("scheme, impl", [("int4-g32", "torch"), ("int8", "naive"), ("fp8-e4m3", "naive")])
def test_quantized_weights_replace_the_layer_projections(scheme, impl):
    plain = ReferenceDecoder(TINY, 2, "cpu", torch.float32, max_tokens=16, max_batch=2, seed=3)
    packed = ReferenceDecoder(TINY, 2, "cpu", torch.float32, max_tokens=16, max_batch=2, seed=3, weights=scheme,
                              weights_impl=impl)
    layer = packed.layers[0]
    assert all(isinstance(getattr(layer, n), rd.QuantizedLinear) for n in ("qkv", "o", "gate_up", "down"))
    assert isinstance(packed.lm_head, torch.nn.Linear)  # the head stays in the activation dtype
    x = torch.randn(2, 5, TINY.hidden, generator=torch.Generator().manual_seed(1))
    out = layer.gate_up(x)
    ref = x.double() @ layer.gate_up.qweight.dequantize(torch.float64).T
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    _, a = plain.prefill(2, 7, x=_inputs(2, 7, seed=2).float(), return_hidden=True)
    _, b = packed.prefill(2, 7, x=_inputs(2, 7, seed=2).float(), return_hidden=True)
    gap = ((a - b).abs().max() / a.abs().max()).item()
    assert 0 < gap < 0.2  # the scheme's own error, through two layers
    with packed.record_ops() as ops:
        packed.decode_step(2, 7)
    assert [op["name"] for op in ops if op["op"] == "linear"][:4] == ["qkv", "o", "gate_up", "down"]


def test_a_served_mla_mixture_packs_its_projections_and_experts_and_keeps_the_router_and_absorbed_halves():
    mix = DecoderConfig(hidden=96, intermediate=40, layers=2, q_heads=4, kv_heads=4, head_dim=16, vocab=97,
                        name="tiny-mla-moe", experts=5, top_k=2, shared_intermediate=40, dense_layers=1,
                        dense_intermediate=120, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16,
                        q_lora_rank=48)
    plain = ReferenceDecoder(mix, 2, "cpu", torch.float32, max_tokens=16, max_batch=2, seed=4)
    packed = ReferenceDecoder(mix, 2, "cpu", torch.float32, max_tokens=16, max_batch=2, seed=4, weights="fp8-b128",
                              weights_impl="naive", experts="mxfp4", moe_impl="naive")
    dense, moe = packed.layers
    assert isinstance(dense.dense_gate_up, rd.QuantizedLinear) and isinstance(moe.mla.q_kv_a, rd.QuantizedLinear)
    assert isinstance(moe.mla.kv_b, rd.QuantizedLinear) and isinstance(moe.mixture.router, torch.nn.Linear)
    w_uk, _ = moe.mla.absorbed_weights()  # decode absorbs kv_b dequantized to the activation dtype, once
    assert w_uk.dtype == torch.float32 and moe.mla.absorbed_weights()[0] is w_uk
    assert torch.equal(w_uk.reshape(-1), moe.mla.kv_b.qweight.dequantize(torch.float32).view(4, 32, 32)[:, :16]
                       .reshape(-1))
    assert isinstance(moe.mixture.gate_up, rd.QuantizedLinear)  # the shared experts: a projection
    assert moe.mixture.w_gate_up.scheme == "mxfp4" and moe.mixture.w_gate_up.shape == (5, 80, 96)
    x = _inputs(2, 7, seed=5).float()[..., :96]
    _, a = plain.prefill(2, 7, x=x, return_hidden=True)
    _, b = packed.prefill(2, 7, x=x, return_hidden=True)
    gap = ((a - b).abs().max() / a.abs().max()).item()
    assert 0 < gap < 0.5  # mxfp4's and fp8's own error, through two layers
    with packed.record_ops() as ops:
        packed.decode_step(2, 7)
    assert [op.get("scheme") for op in ops if op["op"] == "moe"] == ["mxfp4"]
