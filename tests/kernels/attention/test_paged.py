"""Paged KV caches: every implementation against the float64 reference on the contiguous K/V, with the pages in
shuffled order, lengths that end mid-page, one-token sequences, a single page, and bad tables refused in one line."""

from __future__ import annotations

import zlib

import pytest
import torch
from phasebench.kernels import Unsupported, attention, buffers, prepare, register
from phasebench.kernels.attention.flash import flash_attn_module
from phasebench.kernels.attention.triton_attention import split_kv_attention
from phasebench.kernels.registry import OPS

from ...markers import TRITON_DEVICE, tiered
from ..reference import assert_matches_reference, make_qkv, to_pages
from .test_attention import Shape

IMPLS = ["naive", "flash", "triton", "flex"]


def with_pages(batch, q_heads, kv_heads, q_len, kv_len, head_dim, causal, page, seqlens=None):
    """A shape and the page size its KV cache is read in."""
    return Shape(batch, q_heads, kv_heads, q_len, kv_len, head_dim, causal, seqlens), page


SHAPES = {
    # 300 keys end mid-page at every page size; pages of 16 are smaller than every Triton key block (one table
    # entry per key), pages of 64 and 256 hold whole blocks (one entry per block)
    "decode-p16": with_pages(2, 8, 2, 1, 300, 64, True, 16),
    "decode-p64-mha-d80": with_pages(2, 4, 4, 1, 300, 80, True, 64),
    "decode-p256-mqa": with_pages(2, 8, 1, 1, 300, 128, True, 256),
    # a one-token sequence, a sequence of exactly one page, one that ends mid-page, a full one
    "ragged-p16": with_pages(4, 8, 2, 1, 300, 64, True, 16, (1, 16, 129, 300)),
    "ragged-p256": with_pages(3, 4, 1, 1, 300, 64, False, 256, (300, 1, 256)),
    "single-page": with_pages(1, 4, 2, 1, 7, 64, True, 16),
    "verify-p16": with_pages(3, 8, 2, 4, 200, 64, True, 16, (200, 4, 77)),
    "verify-p64": with_pages(2, 8, 2, 8, 200, 64, True, 64),
    "chunk-p16": with_pages(2, 4, 2, 40, 200, 32, True, 16, (200, 77)),  # past split-KV's rows: the tiled kernel
    "chunk-p128": with_pages(1, 4, 1, 33, 150, 64, True, 128),
}
CASES = [(name, dtype) for name in SHAPES for dtype in (torch.float32, torch.bfloat16)
         if dtype == torch.float32 or name in ("decode-p16", "ragged-p16", "verify-p64", "chunk-p16")]


def paged_inputs(paged, dtype, device, seed):
    shape, page = paged
    q, k, v = make_qkv(shape.batch, shape.q_heads, shape.kv_heads, shape.q_len, shape.kv_len, shape.head_dim,
                       dtype=dtype, seed=seed)
    k_pool, v_pool, table = to_pages(k, v, page, shape.seqlens, seed=seed)
    # without cache_seqlens a sequence uses every key of its table's pages: a length that ends mid-page needs them
    seqlens = shape.seqlens or ((shape.kv_len,) * shape.batch if shape.kv_len % page else None)
    lens = None if seqlens is None else torch.tensor(seqlens, dtype=torch.int32, device=device)
    return (q, k, v), (q.to(device), k_pool.to(device), v_pool.to(device), table.to(device), lens)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("impl", tiered(IMPLS))
@pytest.mark.parametrize("name,dtype", CASES, ids=[f"{n}-{str(d)[6:]}" for n, d in CASES])
def test_paged_matches_the_contiguous_reference(name, dtype, impl, device):
    shape = SHAPES[name][0]
    (q, k, v), (qd, k_pool, v_pool, table, lens) = paged_inputs(SHAPES[name], dtype, device, zlib.crc32(name.encode()))
    try:
        call = prepare(qd, k_pool, v_pool, impl=impl, causal=shape.causal, cache_seqlens=lens, block_table=table)
    except Unsupported as err:
        pytest.skip(f"{impl} on {device}: {err}")
    with buffers.poisoned():
        out = call.run()
    assert_matches_reference(out.cpu(), q, k, v, causal=shape.causal, seqlens=shape.seqlens)


@pytest.mark.parametrize("num_splits", [1, 3, 16])
def test_split_kv_pages_with_forced_split_counts(num_splits):
    # 16 splits of 300 keys leave empty chunks; splits start on block boundaries inside pages of 256
    paged = with_pages(3, 8, 2, 1, 300, 64, True, 256, (300, 1, 65))
    (q, k, v), (qd, k_pool, v_pool, table, lens) = paged_inputs(paged, torch.float32, TRITON_DEVICE, num_splits)
    with buffers.poisoned():
        out = split_kv_attention(qd, k_pool, v_pool, causal=True, cache_seqlens=lens, block_table=table,
                                 num_splits=num_splits)
    assert_matches_reference(out.cpu(), q, k, v, causal=True, seqlens=paged[0].seqlens)


def test_backends_name_the_paged_route():
    shape = SHAPES["ragged-p16"]
    _, (q, k_pool, v_pool, table, lens) = paged_inputs(shape, torch.float32, "cpu", 0)
    args = dict(q=q, k=k_pool, v=v_pool, causal=True, cache_seqlens=lens, block_table=table)
    assert prepare(**args, impl="naive").backend == "gather+torch-matmul"
    assert prepare(**args, impl="flash").backend.startswith("gather+sdpa-flash")
    if TRITON_DEVICE == "cpu":
        assert prepare(**args, impl="triton").backend == "triton-splitkv+paged:interpreter"


def test_a_table_in_pool_order_gives_another_answer_than_the_shuffled_one():
    # the test inputs really are shuffled: reading the pool in order is wrong
    shape = SHAPES["decode-p16"]
    (q, k, v), (_, k_pool, v_pool, table, lens) = paged_inputs(shape, torch.float32, "cpu", 3)
    in_order = torch.arange(table.numel(), dtype=torch.int32).view(table.shape)
    assert not torch.equal(in_order, table)
    wrong = attention(q, k_pool, v_pool, impl="naive", causal=True, cache_seqlens=lens, block_table=in_order)
    with pytest.raises(AssertionError, match="relative error|NaN"):  # other pages, or the NaN spare ones
        assert_matches_reference(wrong, q, k, v, causal=True)


def _bad_table_cases():
    shape = with_pages(2, 4, 2, 1, 40, 16, True, 16, (40, 17))  # 3 and 2 pages
    _, (q, k_pool, v_pool, table, lens) = paged_inputs(shape, torch.float32, "cpu", 5)
    outside, negative, short = table.clone(), table.clone(), table[:, :2]
    outside[1, 1] = k_pool.shape[0]
    negative[0, 2] = -1
    base = dict(q=q, k=k_pool, v=v_pool, causal=True, cache_seqlens=lens, block_table=table)
    return base, {
        "out-of-range": (dict(block_table=outside), r"block_table: entry \[1, 1\] = \d+ is outside the pool's pages"),
        "negative": (dict(block_table=negative), r"block_table: entry \[0, 2\] = -1 is outside"),
        "too-short": (dict(block_table=short), r"block_table: row 0 holds 2 pages of 16 tokens \(32 keys\), too few "
                                               r"for cache_seqlens\[0\]=40"),
        "int64": (dict(block_table=table.long()), "block_table: must have dtype int32, got torch.int64"),
        "rank": (dict(block_table=table[0]), r"block_table: must have shape \[B, max_pages\] with B=2"),
        "list": (dict(block_table=table.tolist()), "block_table: must be an int32 tensor"),
        "device": (dict(block_table=table.to("meta")), "block_table: device must match q"),
        "pool-rank": (dict(k=k_pool[0], v=v_pool[0]), r"k: must have rank 4 \(\[num_pages, page_size, Hkv, D\]"),
        "pool-heads": (dict(k=k_pool[:, :, :1].expand(-1, -1, 3, -1), v=v_pool[:, :, :1].expand(-1, -1, 3, -1)),
                       r"Hq % Hkv == 0"),
    }


@pytest.mark.parametrize("impl", tiered(IMPLS))
@pytest.mark.parametrize("case", list(_bad_table_cases()[1]))
def test_bad_tables_get_a_one_line_value_error(case, impl):
    base, cases = _bad_table_cases()
    over, message = cases[case]
    args = {**base, **over}
    with pytest.raises(ValueError, match=message) as info:
        attention(**args, impl=impl)
    assert "\n" not in str(info.value)


def test_the_good_table_of_those_cases_passes():
    base, _ = _bad_table_cases()
    assert attention(**base, impl="naive").shape == base["q"].shape


def test_padding_past_a_sequences_pages_is_never_read():
    # -1 and a page past the pool in the unused entries are accepted, and ignored by every impl
    paged = with_pages(2, 4, 2, 1, 64, 32, True, 16, (64, 5))
    (q, k, v), (_, k_pool, v_pool, table, lens) = paged_inputs(paged, torch.float32, "cpu", 9)
    table[1, 1:] = torch.tensor([-1, k_pool.shape[0], 1 << 30], dtype=torch.int32)
    for impl in ("naive", "flash") + (("triton",) if TRITON_DEVICE == "cpu" else ()):
        out = attention(q, k_pool, v_pool, impl=impl, causal=True, cache_seqlens=lens, block_table=table)
        assert_matches_reference(out, q, k, v, causal=True, seqlens=paged[0].seqlens)


def test_impls_and_plugins_that_do_not_declare_pages_are_unsupported():
    _, (q, k_pool, v_pool, table, lens) = paged_inputs(SHAPES["single-page"], torch.float32, "cpu", 1)

    def contiguous_only(q, k, v, *, causal, scale, cache_seqlens):
        return attention(q, k, v, impl="naive", causal=causal, scale=scale, cache_seqlens=cache_seqlens)

    seen = {}

    def paged_plugin(q, k, v, *, causal, scale, cache_seqlens, block_table):
        seen["table"] = block_table
        return attention(q, k, v, impl="naive", causal=causal, scale=scale, cache_seqlens=cache_seqlens,
                         block_table=block_table)

    register("attention", "contiguous_only", contiguous_only)
    register("attention", "paged_plugin", paged_plugin, paged=True)
    try:
        with pytest.raises(Unsupported, match="contiguous_only does not read a paged KV cache"):
            prepare(q, k_pool, v_pool, impl="contiguous_only", block_table=table)
        out = attention(q, k_pool, v_pool, impl="paged_plugin", causal=True, block_table=table)
        assert seen["table"] is table and out.shape == q.shape
        # a contiguous call reaches a paged plugin without the block_table argument, as before
        q2, k2, v2 = make_qkv(1, 4, 2, 1, 9, 16)
        seen.clear()
        with pytest.raises(TypeError, match="block_table"):
            attention(q2, k2, v2, impl="paged_plugin")
    finally:
        OPS["attention"].pop("contiguous_only", None)
        OPS["attention"].pop("paged_plugin", None)
    with pytest.raises(ValueError, match="paged: must be a bool, and True only for attention"):
        register("linear", "paged_linear", lambda x, w: x @ w.T, paged=True)


@pytest.mark.cuda
@pytest.mark.skipif(flash_attn_module() is None, reason="flash_attn is not installed (flash is SDPA's backend)")
def test_flash_attn_reads_pages_of_256_in_place_and_skips_smaller_ones():
    (q, k, v), (qd, k_pool, v_pool, table, lens) = paged_inputs(
        with_pages(3, 8, 2, 1, 600, 128, True, 256, (600, 1, 257)), torch.bfloat16, "cuda", 4)
    call = prepare(qd, k_pool, v_pool, impl="flash", causal=True, cache_seqlens=lens, block_table=table)
    assert call.backend.startswith("flash_attn-") and call.backend.endswith(":with_kvcache+paged")
    assert_matches_reference(call.run().cpu(), q, k, v, causal=True, seqlens=(600, 1, 257))
    _, (qd, k_pool, v_pool, table, lens) = paged_inputs(SHAPES["ragged-p16"], torch.bfloat16, "cuda", 4)
    with pytest.raises(Unsupported, match="multiple of 256"):
        prepare(qd, k_pool, v_pool, impl="flash", causal=True, cache_seqlens=lens, block_table=table)
