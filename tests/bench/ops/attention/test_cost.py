"""The cost model on hand-computed cases."""

from __future__ import annotations

import pytest
from phasebench.bench.ops.attention.cases import AttentionCase
from phasebench.bench.ops.attention.cost import flops, intensity, min_bytes, moved_bytes, pairs


def case(b, hq, hkv, sq, sk, d, causal, dtype="bfloat16"):
    return AttentionCase(b, hq, hkv, sq, sk, d, causal, dtype)


def brute_force_pairs(c):
    return sum(1 for i in range(c.q_len) for j in range(c.kv_len) if not c.causal or j <= c.kv_len - c.q_len + i)


def test_mha_without_mask():
    c = case(2, 4, 4, 8, 8, 16, False, "float16")
    assert flops(c) == 4 * 2 * 4 * 16 * 64 == 32768
    assert min_bytes(c) == 2 * (2 * 2 * 4 * 8 * 16 + 2 * 2 * 4 * 8 * 16) == 8192
    assert intensity(c) == 4.0


def test_gqa_counts_kv_by_kv_heads():
    c = case(1, 8, 2, 16, 16, 32, False, "float32")
    assert flops(c) == 4 * 8 * 32 * 256 == 262144
    # q and o: 2 * 8 heads * 16 * 32; k and v: 2 * 2 heads * 16 * 32; 4 bytes each
    assert min_bytes(c) == 4 * (2 * 8 * 16 * 32 + 2 * 2 * 16 * 32) == 40960


def test_causal_square_keeps_the_lower_triangle():
    c = case(1, 1, 1, 4, 4, 8, True)
    assert pairs(c) == 10 == brute_force_pairs(c)
    assert flops(c) == 4 * 8 * 10


def test_causal_chunk_is_aligned_bottom_right():
    c = case(1, 2, 1, 3, 10, 8, True)
    assert pairs(c) == 3 * 7 + 6 == 27 == brute_force_pairs(c)
    assert flops(c) == 4 * 2 * 8 * 27


@pytest.mark.parametrize("sq,sk,causal", [(1, 1, True), (5, 5, True), (7, 97, True), (13, 40, False), (1, 33, True)])
def test_pairs_match_brute_force(sq, sk, causal):
    c = case(1, 1, 1, sq, sk, 8, causal)
    assert pairs(c) == brute_force_pairs(c)


def test_decode_intensity_is_about_the_gqa_ratio():
    c = case(1, 32, 8, 1, 131072, 128, True)
    assert pairs(c) == 131072
    assert flops(c) == 4 * 32 * 128 * 131072
    assert min_bytes(c) == 2 * (2 * 32 * 128 + 2 * 8 * 131072 * 128)
    assert intensity(c) == pytest.approx(32 / 8, rel=1e-3)


def test_prefill_intensity_grows_with_length():
    short, long = case(1, 32, 32, 512, 512, 128, True), case(1, 32, 32, 8192, 8192, 128, True)
    assert intensity(long) > 10 * intensity(short)
    assert intensity(long) == pytest.approx(8192 / 4, rel=0.01)  # Sq/4 for causal MHA in bf16 (Sq/2 unmasked)


def test_ragged_cost_sums_each_sequence():
    lens = (97, 1025, 3)
    ragged = AttentionCase(3, 8, 2, 1, 1025, 64, True, "bfloat16", seqlens=lens)
    per_seq = [AttentionCase(1, 8, 2, 1, n, 64, True, "bfloat16") for n in lens]
    assert flops(ragged) == pytest.approx(sum(flops(c) for c in per_seq))
    assert min_bytes(ragged) == pytest.approx(sum(min_bytes(c) for c in per_seq))
    chunk = AttentionCase(2, 8, 2, 5, 40, 64, True, "float32", seqlens=(40, 7))
    one = [AttentionCase(1, 8, 2, 5, n, 64, True, "float32") for n in (40, 7)]
    assert flops(chunk) == pytest.approx(4 * 8 * 64 * sum(brute_force_pairs(c) for c in one))


@pytest.mark.parametrize("c", [case(2, 12, 4, 1, 1025, 80, True), case(1, 6, 2, 97, 1031, 72, True, "float32"),
                               AttentionCase(3, 8, 2, 1, 999, 64, True, "bfloat16", seqlens=(97, 999, 3),
                                             page_size=32)])
def test_reads_q_k_v_and_the_block_table_and_writes_o(c):
    """q, k and v (by kv heads and the keys each sequence uses) and a paged cache's table entries are read; o alone
    is written: what a decode's floor puts at the read ceiling."""
    lens = c.seqlens or (c.kv_len,) * c.batch
    table = 4 * sum(-(-n // c.page_size) for n in lens) if c.page_size else 0
    elem = 4 if c.dtype == "float32" else 2
    read, written = moved_bytes(c)
    assert written == elem * c.batch * c.q_heads * c.q_len * c.head_dim
    assert read == elem * (c.batch * c.q_heads * c.q_len * c.head_dim + 2 * c.kv_heads * sum(lens) * c.head_dim) + table
    assert read + written == min_bytes(c)


def brute_force_window(q_len, kv_len, causal, window):
    """(query, key) pairs a sliding window keeps, and the keys some query reads, counted one by one."""
    kept = [(i, j) for i in range(q_len) for j in range(kv_len)
            if (not causal or j <= kv_len - q_len + i) and j >= kv_len - q_len + i - window]
    return len(kept), len({j for _, j in kept})


@pytest.mark.parametrize("q_len, kv_len, causal, window", [
    (1, 300, True, 127), (2, 300, True, 37), (97, 97, True, 16), (40, 150, True, 50), (33, 70, False, 5),
    (5, 9, True, 1000), (20, 20, True, 0), (12, 7, False, 3),  # a window past the sequence; the diagonal alone
])
def test_a_window_counts_the_pairs_it_keeps_and_the_keys_it_reads(q_len, kv_len, causal, window):
    c = AttentionCase(1, 2, 1, q_len, kv_len, 16, causal, "bfloat16", window_left=window)
    kept, keys = brute_force_window(q_len, kv_len, causal, window)
    assert pairs(c) == kept and flops(c) == 4 * 2 * 16 * kept
    read, _ = moved_bytes(c)
    assert read == 2 * (2 * q_len * 16 + 2 * keys * 16) and c.keys_read(kv_len) == keys


def test_a_window_decode_reads_a_bounded_slice_and_sinks_their_logits():
    full = AttentionCase(4, 64, 8, 1, 65536, 64, True, "bfloat16", sinks=True)
    window = AttentionCase(4, 64, 8, 1, 65536, 64, True, "bfloat16", window_left=127, sinks=True)
    paged = AttentionCase(4, 64, 8, 1, 65536, 64, True, "bfloat16", window_left=127, page_size=16)
    kv = lambda keys: 2 * 4 * 8 * keys * 64 * 2  # noqa: E731  (K and V of 4 sequences in bf16)
    queries = 2 * 4 * 64 * 64
    assert moved_bytes(full)[0] == queries + kv(65536) + 4 * 64
    assert moved_bytes(window)[0] == queries + kv(128) + 4 * 64
    # keys 65408..65535 lie in pages 4088..4095 of 16: eight table entries a sequence
    assert moved_bytes(paged)[0] == queries + kv(128) + 4 * 4 * 8
