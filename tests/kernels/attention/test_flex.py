"""FlexAttention in the default tier (its full peer matrices run in the slow tier): a shape of each mask it builds
against the float64 reference, NaN past each length never reaching the output, the slots it zeroes and only those,
the block mask built once in the plan, a second plan of a case compiling nothing, and the host's sinks refused."""

from __future__ import annotations

import pytest
import torch
from phasebench.kernels import Unsupported, buffers, inductor, prepare, prepare_mla
from phasebench.kernels.attention.flex import block_sizes, tail_rows
from phasebench.kernels.attention.request import validate

from ..reference import assert_matches_reference, make_qkv, reference, to_pages
from .test_attention import Shape

NAN = float("nan")
# name: (shape, page size, window_left, dtype)
SHAPES = {
    "prefill-gqa-causal-d80": (Shape(1, 6, 2, 17, 17, 80, True), 0, -1, torch.bfloat16),
    "chunk-bottom-right": (Shape(1, 4, 2, 97, 300, 64, True), 0, -1, torch.float32),
    "decode-ragged": (Shape(4, 8, 2, 1, 300, 64, False, (300, 1, 129, 64)), 0, -1, torch.float32),
    "paged-verify4-p16": (Shape(3, 8, 2, 4, 64, 64, True, (37, 5, 60)), 16, -1, torch.bfloat16),
    "window-decode-edge": (Shape(1, 6, 2, 1, 250, 64, True), 0, 100, torch.float32),
}


def poison_past_the_end(k, v, seqlens, page):
    """Contiguous K/V with NaN past each length, or pools (NaN in spare pages) with NaN in each last page's tail."""
    if not page:
        k, v = k.clone(), v.clone()
        for b, n in enumerate(seqlens):
            k[b, :, n:], v[b, :, n:] = NAN, NAN
        return k, v, None
    k_pool, v_pool, table = to_pages(k, v, page, seqlens, seed=5)
    for b, n in enumerate(seqlens):
        last = table[b, (n - 1) // page]
        k_pool[last, n - (n - 1) // page * page:], v_pool[last, n - (n - 1) // page * page:] = NAN, NAN
    return k_pool, v_pool, table


@pytest.mark.parametrize("name", list(SHAPES))
def test_flex_matches_the_float64_reference_with_nan_past_each_length(name):
    shape, page, window, dtype = SHAPES[name]
    q, k, v = make_qkv(shape.batch, shape.q_heads, shape.kv_heads, shape.q_len, shape.kv_len, shape.head_dim,
                       dtype=dtype, seed=len(name))
    seqlens = shape.seqlens or (shape.kv_len,) * shape.batch
    k_in, v_in, table = poison_past_the_end(k, v, seqlens, page)
    lens = torch.tensor(seqlens, dtype=torch.int32) if shape.seqlens or page else None
    call = prepare(q, k_in, v_in, impl="flex", causal=shape.causal, cache_seqlens=lens, block_table=table,
                   window_left=window)
    assert call.backend.startswith("flex-cpp") and call.compiled is not None
    with buffers.poisoned():
        out = call.run()
    assert_matches_reference(out, q, k, v, causal=shape.causal, seqlens=shape.seqlens, window_left=window)
    assert call.compiled.done and call.compiled.seconds > 0 and call.compiled.cache in ("cold", "disk", "memory")


def test_mla_through_flex_reads_a_narrower_value():
    gen = torch.Generator().manual_seed(9)
    seqlens, scale = (37, 5, 60), 0.07
    q = torch.randn((3, 16, 2, 96), generator=gen)
    latent = torch.randn((3, 1, 64, 96), generator=gen)
    pool, _, table = to_pages(latent, latent, 16, seqlens, seed=2)
    call = prepare_mla(q, pool, impl="flex", scale=scale, v_dim=64, cache_seqlens=torch.tensor(seqlens).int(),
                       block_table=table)
    out = call.run()
    assert out.shape == (3, 16, 2, 64) and call.backend.startswith("flex-cpp+paged")
    exact = reference(q, latent, latent[..., :64], causal=True, scale=scale, seqlens=seqlens)
    assert ((out.double() - exact).abs().max() / exact.abs().max()).item() <= 1e-4


def test_the_zeroed_slots_are_the_tails_of_the_last_kept_blocks_only():
    # lengths 5 and 8 of 12 keys in blocks of 4: sequence 0's slots 5..7 (its block 1's tail), none of sequence 1's
    # (8 ends a block); slots 8..11 lie in blocks the mask skips whole and stay NaN
    q, k, v = make_qkv(2, 2, 2, 1, 12, 8, seed=1)
    req = validate(q, k, v, cache_seqlens=torch.tensor([5, 8], dtype=torch.int32))
    rows = tail_rows(req, 4)
    expected = [(0 * 2 + h) * 12 + s for h in range(2) for s in (5, 6, 7)]
    assert sorted(rows.tolist()) == expected
    # a page two sequences read is never written: sequence 1's last page is sequence 0's first
    k_pool, v_pool, table = to_pages(k, v, 4, (5, 6), seed=1)
    table[1, 1] = table[0, 0]
    paged = validate(q, k_pool, v_pool, cache_seqlens=torch.tensor([5, 6], dtype=torch.int32), block_table=table)
    pages = {int(r) // 2 // 4 for r in tail_rows(paged, 4).tolist()}
    assert pages == {int(table[0, 1])}


def test_a_forked_sequence_sharing_its_partial_last_page_gets_its_tail_zeroed():
    # two samples of one prompt (beam search, n > 1): the same table, both ending inside the shared last page
    q, k, v = make_qkv(2, 4, 2, 1, 32, 16, seed=8)
    k[1], v[1] = k[0], v[0]
    k_pool, v_pool, table = to_pages(k[:1], v[:1], 16, (21,), seed=3)
    table = table.expand(2, -1).contiguous()
    last = int(table[0, 1])
    k_pool[last, 5:], v_pool[last, 5:] = NAN, NAN
    lens = torch.tensor([21, 21], dtype=torch.int32)
    call = prepare(q, k_pool, v_pool, impl="flex", cache_seqlens=lens, block_table=table)
    assert call.backend.endswith("+tails-zeroed")
    assert_matches_reference(call.run(), q, k, v, seqlens=(21, 21))
    assert torch.isnan(k_pool[last, 5:]).all()  # only V is written: the mask replaces a masked key's score


def test_a_page_listed_twice_in_one_sequence_is_refused():
    q, k, v = make_qkv(1, 2, 1, 1, 48, 16, seed=9)
    k_pool, v_pool, table = to_pages(k, v, 16, (40,), seed=1)
    table[0, 2] = table[0, 0]
    with pytest.raises(Unsupported, match="sequence 0 lists a page twice"):
        prepare(q, k_pool, v_pool, impl="flex", cache_seqlens=torch.tensor([40], dtype=torch.int32),
                block_table=table)


def test_a_ragged_call_writes_zeros_into_the_tails_and_nothing_past_them():
    # the decode-ragged shape above (its graph): lengths 300, 1, 129 and 64 against the key tile of a decode
    shape, _, _, dtype = SHAPES["decode-ragged"]
    q, k, v = make_qkv(shape.batch, shape.q_heads, shape.kv_heads, shape.q_len, shape.kv_len, shape.head_dim,
                       dtype=dtype, seed=4)
    lens = torch.tensor(shape.seqlens, dtype=torch.int32)
    k_in, v_in, _ = poison_past_the_end(k, v, shape.seqlens, 0)
    call = prepare(q, k_in, v_in, impl="flex", cache_seqlens=lens)
    block = block_sizes(validate(q, k, v, cache_seqlens=lens), "cpu")[1]
    assert 129 < block < shape.kv_len
    call.run()
    assert (v_in[2, :, 129:block] == 0).all() and (v_in[3, :, 64:block] == 0).all()
    assert torch.isnan(v_in[2, :, block:]).all() and torch.isnan(k_in[2, :, 129:]).all()  # nothing else written
    assert torch.equal(v_in[0], v[0]) and torch.equal(v_in[2, :, :129], v[2, :, :129])


def test_a_second_plan_of_a_case_compiles_nothing_and_builds_its_own_block_mask():
    q, k, v = make_qkv(1, 4, 2, 97, 300, 64, seed=6)  # the chunk-bottom-right shape above
    first = prepare(q, k, v, impl="flex", causal=True)
    first.run()
    graphs = inductor.graph_count()
    again = prepare(q.clone(), k.clone(), v.clone(), impl="flex", causal=True)
    again.run()
    assert inductor.graph_count() == graphs and again.compiled.graphs == 0 and again.compiled.cache == "memory"
    assert again.compiled.build_s > 0  # a causal chunk has a block mask, built in the plan
    decode = prepare(q[:, :, :1], k, v, impl="flex")
    assert decode.compiled.build_s > 0 and not decode.compiled.done  # its dense block mask; nothing runs yet


def test_sinks_on_the_host_are_refused_with_the_reason():
    q, k, v = make_qkv(1, 4, 2, 1, 70, 32, seed=7)
    with pytest.raises(Unsupported, match="returns no log-sum-exp"):
        prepare(q, k, v, impl="flex", sinks=torch.zeros(4))
