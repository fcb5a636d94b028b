"""The hybrid iteration against the separate decode step and chunk extend on the same weights and caches (float64),
chunks in sequence against one prefill, its ops traced once over the stacked tokens, and its bad input."""

from __future__ import annotations

import pytest
import torch
from phasebench.bench.phases.hybrid_step import HybridStep, chunk_plan, hybrid_step
from phasebench.bench.phases.reference_decoder import ReferenceDecoder
from phasebench.bench.spec.models import DecoderConfig

ODD = DecoderConfig(hidden=80, intermediate=136, layers=3, q_heads=6, kv_heads=3, head_dim=20, vocab=103,
                    name="odd-hybrid")
CLOSE = dict(rtol=1e-10, atol=1e-10)


def _decoder(max_tokens=31, max_batch=5, seed=7):
    decoder = ReferenceDecoder(ODD, 3, "cpu", torch.float64, max_tokens=max_tokens, max_batch=max_batch, seed=seed)
    decoder._fill_cache()
    return decoder


def _randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _copy_row(decoder, to_row, source, from_row):
    for mine, theirs in zip(decoder.layers, source.layers, strict=True):
        mine.k_cache[to_row] = theirs.k_cache[from_row]
        mine.v_cache[to_row] = theirs.v_cache[from_row]


@pytest.mark.parametrize(("batch", "context", "start", "tokens"), [(3, 11, 5, 7), (1, 0, 0, 9), (4, 17, 13, 1)])
def test_a_hybrid_iteration_equals_the_decode_step_and_the_chunk_extend(batch, context, start, tokens):
    hybrid, alone, chunk = _decoder(), _decoder(), _decoder()
    row = batch  # the prompt's cache row follows the decode users'
    _copy_row(chunk, 0, hybrid, row)  # extend(batch=1) uses row 0: give it the prompt's prefix
    x_decode, x_prompt = _randn(batch, 1, ODD.hidden, seed=1), _randn(1, tokens, ODD.hidden, seed=2)
    step = HybridStep(batch, context, start, tokens, last=True)
    ids, h_decode, h_prompt = hybrid_step(hybrid, step, x_decode, x_prompt, return_hidden=True)
    ids_decode, ref_decode = alone.decode_step(batch, context, x=x_decode, return_hidden=True)
    ids_chunk, ref_chunk = chunk.extend(1, start, tokens, x=x_prompt, return_hidden=True)
    torch.testing.assert_close(h_decode, ref_decode, **CLOSE)
    torch.testing.assert_close(h_prompt, ref_chunk, **CLOSE)
    assert ids.tolist() == ids_decode.tolist() + ids_chunk.tolist()
    for mine, a, c in zip(hybrid.layers, alone.layers, chunk.layers, strict=True):
        for cache in ("k_cache", "v_cache"):  # every row written where the separate calls wrote it, and no other
            torch.testing.assert_close(getattr(mine, cache)[:batch], getattr(a, cache)[:batch], **CLOSE)
            torch.testing.assert_close(getattr(mine, cache)[row], getattr(c, cache)[0], **CLOSE)
            torch.testing.assert_close(getattr(mine, cache)[row + 1:], getattr(a, cache)[row + 1:], **CLOSE)


def test_an_iteration_of_one_part_equals_that_part_alone():
    hybrid, alone = _decoder(), _decoder()
    x = _randn(2, 1, ODD.hidden, seed=3)
    ids, h, none = hybrid_step(hybrid, HybridStep(2, 9), x, return_hidden=True)
    ids_ref, h_ref = alone.decode_step(2, 9, x=x, return_hidden=True)
    torch.testing.assert_close(h, h_ref, **CLOSE)
    assert ids.tolist() == ids_ref.tolist() and none.shape == (1, 0, ODD.hidden)
    prompt = _randn(1, 6, ODD.hidden, seed=4)
    ids, _, h = hybrid_step(hybrid, HybridStep(0, 0, 0, 6, prompt_row=0, last=True), x_prompt=prompt,
                            return_hidden=True)
    ids_ref, h_ref = alone.prefill(1, 6, x=prompt, return_hidden=True)
    torch.testing.assert_close(h, h_ref, **CLOSE)
    assert ids.tolist() == ids_ref.tolist()


@pytest.mark.parametrize("chunk", [5, 1, 13, None])
def test_chunks_in_sequence_beside_decode_users_give_the_whole_prefill(chunk):
    prompt, batch = 13, 2
    hybrid, whole = _decoder(), _decoder()
    x_prompt = _randn(1, prompt, ODD.hidden, seed=5)
    ids_ref, h_ref = whole.prefill(1, prompt, x=x_prompt, return_hidden=True)
    plan = chunk_plan(prompt, chunk)
    hidden, ids = [], None
    for i, (start, tokens) in enumerate(plan):  # the users move on one token per iteration
        step = HybridStep(batch, 8 + i, start, tokens, last=i == len(plan) - 1)
        ids, _, h = hybrid_step(hybrid, step, _randn(batch, 1, ODD.hidden, seed=10 + i),
                                x_prompt[:, start:start + tokens], return_hidden=True)
        assert len(ids) == batch + step.last
        hidden.append(h)
    torch.testing.assert_close(torch.cat(hidden, dim=1), h_ref, **CLOSE)
    assert ids[-1].item() == ids_ref.item()


def test_projections_run_once_over_the_stacked_tokens_and_attention_per_part():
    decoder = _decoder()
    with decoder.record_ops() as ops:
        hybrid_step(decoder, HybridStep(3, 10, 4, 7, last=True))
    linears = [op for op in ops if op["op"] == "linear"]
    assert {op["m"] for op in linears if op["scope"] == "layer"} == {3 + 7}
    assert len(linears) == 4 * 3 + 1 and linears[-1]["name"] == "lm_head" and linears[-1]["m"] == 3 + 1
    attention = [(op["batch"], op["q_len"], op["kv_len"], op["causal"]) for op in ops if op["op"] == "attention"]
    assert attention == [(3, 1, 11, False), (1, 7, 11, True)] * 3


def test_chunk_plans_cover_the_prompt_once():
    assert chunk_plan(10, 4) == [(0, 4), (4, 4), (8, 2)]
    assert chunk_plan(10, None) == [(0, 10)] and chunk_plan(10, 10) == [(0, 10)]
    for prompt, chunk in ((97, 64), (1025, 256), (7, 1)):
        plan = chunk_plan(prompt, chunk)
        assert [s for s, _ in plan] == list(range(0, prompt, chunk)) and sum(t for _, t in plan) == prompt


@pytest.mark.parametrize(("step", "says"), [
    (HybridStep(6, 3), "batch: 6"), (HybridStep(2, 31), "context: 31"), (HybridStep(2, 3, 25, 7), r"start \+ tokens"),
    (HybridStep(2, 3, 0, 4, prompt_row=1), "prompt_row"), (HybridStep(2, 3, 0, 4, prompt_row=5), "prompt_row"),
    (HybridStep(2, 3, last=True), "last:"), (HybridStep(0, 0), "batch, tokens"), (HybridStep(-1, 3), "batch:"),
])
def test_bad_iterations_get_one_line(step, says):
    with pytest.raises(ValueError, match=says) as err:
        hybrid_step(_decoder(), step)
    assert "\n" not in str(err.value)


def test_bad_inputs_and_plans_get_one_line():
    decoder = _decoder()
    with pytest.raises(ValueError, match=r"x_prompt: expected shape \[1, 4, 80\]"):
        hybrid_step(decoder, HybridStep(2, 3, 0, 4), x_prompt=_randn(1, 5, ODD.hidden, seed=1))
    with pytest.raises(ValueError, match="x_prompt: given"):
        hybrid_step(decoder, HybridStep(2, 3), x_prompt=_randn(1, 5, ODD.hidden, seed=1))
    with pytest.raises(ValueError, match="depth"):
        hybrid_step(decoder, HybridStep(2, 3), depth=4)
    for prompt, chunk, says in ((10, 11, "chunk: 11 tokens is more"), (10, 0, "chunk: must"), (0, 4, "prompt:")):
        with pytest.raises(ValueError, match=says):
            chunk_plan(prompt, chunk)


@pytest.mark.cuda
def test_a_cuda_hybrid_iteration_matches_the_host():
    host = _decoder()
    gpu = ReferenceDecoder(ODD, 3, "cuda", torch.float64, max_tokens=31, max_batch=5, seed=7)
    gpu.load_state_dict(host.state_dict())  # CUDA's generator draws other weights; the caches come along
    gpu._cache_filled = True
    x_decode, x_prompt = _randn(3, 1, ODD.hidden, seed=1), _randn(1, 7, ODD.hidden, seed=2)
    step = HybridStep(3, 11, 5, 7, last=True)
    ids, h_decode, h_prompt = hybrid_step(host, step, x_decode, x_prompt, return_hidden=True)
    ids_gpu, g_decode, g_prompt = hybrid_step(gpu, step, x_decode.cuda(), x_prompt.cuda(), return_hidden=True)
    torch.testing.assert_close(g_decode.cpu(), h_decode, rtol=0, atol=1e-10)
    torch.testing.assert_close(g_prompt.cpu(), h_prompt, rtol=0, atol=1e-10)
    assert ids_gpu.tolist() == ids.tolist()
