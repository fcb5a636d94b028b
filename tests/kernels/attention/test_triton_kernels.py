"""The Triton kernels' own knobs: forced split counts, small tiles, dtypes the facade does not cover."""

from __future__ import annotations

import pytest
import torch
from phasebench.kernels import Unsupported, buffers, triton_mode
from phasebench.kernels.attention import triton_prefill
from phasebench.kernels.attention.triton_attention import split_kv_attention
from phasebench.kernels.attention.triton_decode import MAX_SPLITS, choose_splits

from ...markers import TRITON_DEVICE, TRITON_MARKS
from ..reference import assert_matches_reference, make_qkv

pytestmark = TRITON_MARKS
DEVICE = TRITON_DEVICE


@pytest.mark.parametrize("num_splits", [1, 2, 3, 7, 16])
@pytest.mark.parametrize("q_len,seqlens", [(1, None), (1, (300, 1, 65)), (3, (300, 3, 200))])
def test_split_kv_with_forced_split_counts(num_splits, q_len, seqlens):
    # 300 keys are five 64-key blocks: 7 and 16 splits leave chunks with no keys at all
    batch = 1 if seqlens is None else len(seqlens)
    q, k, v = make_qkv(batch, 4, 1, q_len, 300, 64, device=DEVICE, seed=num_splits)
    lens = None if seqlens is None else torch.tensor(seqlens, dtype=torch.int32, device=DEVICE)
    with buffers.poisoned():
        out = split_kv_attention(q, k, v, causal=True, cache_seqlens=lens, num_splits=num_splits)
    assert_matches_reference(out.cpu(), q.cpu(), k.cpu(), v.cpu(), causal=True, seqlens=seqlens)


def test_split_kv_rejects_bad_split_count_and_long_queries():
    q, k, v = make_qkv(1, 2, 2, 1, 64, 32, device=DEVICE)
    with pytest.raises(ValueError, match="num_splits"):
        split_kv_attention(q, k, v, num_splits=0)
    q_long, k_long, v_long = make_qkv(1, 2, 2, 64, 64, 32, device=DEVICE)
    with pytest.raises(Unsupported, match="split-KV"):
        split_kv_attention(q_long, k_long, v_long)


def test_split_count_follows_multiprocessors_and_kv_length():
    assert choose_splits(batch=1, kv_heads=8, kv_len=131072, multiprocessors=132) == 33
    assert choose_splits(batch=64, kv_heads=8, kv_len=131072, multiprocessors=132) == 1
    assert choose_splits(batch=1, kv_heads=1, kv_len=100, multiprocessors=132) == 2  # two 64-key blocks
    assert choose_splits(batch=1, kv_heads=1, kv_len=1 << 20, multiprocessors=1000) == MAX_SPLITS


@pytest.mark.skipif(not triton_mode.interpreted(), reason="the fixed tile is the interpreter's")
@pytest.mark.parametrize("causal,q_len,kv_len", [(True, 97, 250), (False, 50, 97), (True, 64, 64)])
def test_prefill_with_small_tiles_crosses_many_blocks(monkeypatch, causal, q_len, kv_len):
    monkeypatch.setitem(triton_prefill.INTERPRETER_CONFIG, "BLOCK_M", 16)
    monkeypatch.setitem(triton_prefill.INTERPRETER_CONFIG, "BLOCK_N", 16)
    q, k, v = make_qkv(1, 4, 2, q_len, kv_len, 48, seed=q_len)
    from phasebench.kernels import attention
    with buffers.poisoned():
        out = attention(q, k, v, impl="triton", causal=causal)
    assert_matches_reference(out, q, k, v, causal=causal)


@pytest.mark.skipif(not triton_mode.interpreted(), reason="relies on the interpreter's fixed 64x64 tile")
@pytest.mark.parametrize("query_block", [0, 1])
def test_causal_prefill_never_loads_blocks_beyond_the_diagonal(monkeypatch, query_block):
    # NaN values in every key block past this query block's diagonal: a kernel that loaded them
    # and only masked the scores would multiply NaN by a zero probability and return NaN.
    monkeypatch.setitem(triton_prefill.INTERPRETER_CONFIG, "BLOCK_M", 64)
    monkeypatch.setitem(triton_prefill.INTERPRETER_CONFIG, "BLOCK_N", 64)
    q, k, v = make_qkv(1, 2, 1, 256, 256, 32, seed=query_block)
    first_unseen = (query_block + 1) * 64
    v_poisoned = v.clone()
    v_poisoned[:, :, first_unseen:] = float("nan")
    from phasebench.kernels import attention
    out = attention(q, k, v_poisoned, impl="triton", causal=True)
    rows = slice(0, first_unseen)
    assert_matches_reference(out[:, :, rows], q[:, :, rows], k[:, :, :first_unseen], v[:, :, :first_unseen],
                             causal=True)
