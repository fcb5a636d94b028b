"""What lies past a sequence's length never reaches the output: with NaN there (a server's stale pool; FlashMLA's own
test fills it so), in the tail of each last page and in pages no table entry names, every implementation available
here matches the float64 reference of the clean cache, ragged, paged, with a window and sinks, decode and a chunk."""

from __future__ import annotations

import zlib

import pytest
import torch
from phasebench.kernels import Unsupported, attention, available_impls, buffers

from ...markers import tiered
from ..reference import assert_matches_reference, make_qkv, to_pages
from .test_attention import Shape

NAN = float("nan")
# name: (shape, page size, window_left, sinks)
SHAPES = {
    "paged-decode-b3-p16": (Shape(3, 8, 2, 1, 64, 64, True, (37, 5, 60)), 16, -1, False),
    "ragged-decode": (Shape(3, 8, 2, 1, 64, 64, True, (37, 5, 60)), 0, -1, False),
    "ragged-verify4": (Shape(3, 8, 2, 4, 64, 64, True, (37, 5, 60)), 0, -1, False),
    "ragged-chunk": (Shape(2, 4, 2, 40, 200, 32, True, (200, 77)), 0, -1, False),  # Triton's tiled kernel
    "paged-chunk-p16": (Shape(2, 4, 2, 40, 200, 32, True, (200, 77)), 16, -1, False),
    "window-sinks-ragged": (Shape(3, 8, 2, 1, 64, 64, True, (37, 5, 60)), 0, 20, True),
    "window-sinks-paged-p16": (Shape(3, 8, 2, 1, 64, 64, True, (37, 5, 60)), 16, 20, True),
}
BUILTINS = ("naive", "flash", "triton", "sdpa_efficient", "cudnn", "flex")


def impls():
    return [name for name in available_impls("cpu") if name in BUILTINS]


def poisoned_past_the_end(k, v, page, seqlens, seed):
    """The cache as the kernels get it: contiguous K/V with NaN past each length, or pools (NaN in spare pages) with
    NaN in the tail of each sequence's last page too."""
    if not page:
        k, v = k.clone(), v.clone()
        for b, n in enumerate(seqlens):
            k[b, :, n:] = NAN
            v[b, :, n:] = NAN
        return k, v, None
    k_pool, v_pool, table = to_pages(k, v, page, seqlens, seed=seed)
    for b, n in enumerate(seqlens):
        last = table[b, (n - 1) // page]
        k_pool[last, n - (n - 1) // page * page:] = NAN
        v_pool[last, n - (n - 1) // page * page:] = NAN
    return k_pool, v_pool, table


@pytest.mark.parametrize("impl", tiered(impls()))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(SHAPES))
def test_nan_past_each_length_never_reaches_the_output(name, dtype, impl):
    shape, page, window, with_sinks = SHAPES[name]
    seed = zlib.crc32(name.encode())
    q, k, v = make_qkv(shape.batch, shape.q_heads, shape.kv_heads, shape.q_len, shape.kv_len, shape.head_dim,
                       dtype=dtype, seed=seed)
    sinks = torch.randn(shape.q_heads, generator=torch.Generator().manual_seed(seed)) + 3 if with_sinks else None
    cache_k, cache_v, table = poisoned_past_the_end(k, v, page, shape.seqlens, seed)
    assert torch.isnan(cache_k).any() and torch.isnan(cache_v).any()
    lens = torch.tensor(shape.seqlens, dtype=torch.int32)
    try:
        with buffers.poisoned():
            out = attention(q, cache_k, cache_v, impl=impl, causal=shape.causal, cache_seqlens=lens,
                            block_table=table, window_left=window, sinks=sinks)
    except Unsupported as err:
        pytest.skip(f"{impl}: {err}")
    assert_matches_reference(out, q, k, v, causal=shape.causal, seqlens=shape.seqlens, window_left=window,
                             sinks=sinks)
