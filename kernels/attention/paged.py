"""Paged KV caches outside Triton: the gather of a block table's pages into contiguous BHSD K and V.

The pools are [num_pages, page_size, Hkv, D] (FlashAttention's layout): key j of sequence b lives in page
block_table[b, j // page_size] at slot j % page_size. The gather is one index_select per pool over the pool's
[num_pages * page_size * Hkv, D] rows, straight into BHSD order; the row index is built when the call is
planned, and the copy itself runs inside the call, so it is part of what the route costs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from .request import AttentionRequest


def gather_index(req: AttentionRequest) -> torch.Tensor:
    """int64 [B * Hkv * Sk]: the pool row of each (sequence, kv head, key) in BHSD order. A key past a sequence's
    length is read as its key 0 instead (the math masks it): the gather touches only the slots the sequence holds, so
    what lies past its end (the tail of its last page, pages no entry names, padding in the table: a server's stale
    values, NaN) never reaches the copy."""
    dev, page, heads = req.q.device, req.page_size, req.kv_heads
    table = req.block_table.to(torch.int64)
    lengths = req.cache_seqlens.to(torch.int64) if req.cache_seqlens is not None else torch.full(
        (req.batch,), req.kv_len, device=dev)
    keys = torch.arange(req.kv_len, device=dev)[None, :]
    keys = torch.where(keys < lengths[:, None], keys, 0)  # [B, Sk]
    token_rows = table.gather(1, keys // page) * page + keys % page  # [B, Sk]: the token's (page, slot) row
    rows = token_rows[:, None, :] * heads + torch.arange(heads, device=dev)[None, :, None]
    return rows.reshape(-1)


def gatherer(req: AttentionRequest) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    """A function that copies the pages of a paged request into fresh BHSD K and V [B, Hkv, Sk, D]."""
    index = gather_index(req)
    # the pools as rows of D elements (a view where the pools are contiguous, else one copy here, outside the call)
    k_rows, v_rows = (t.reshape(-1, req.head_dim) for t in (req.k, req.v))
    shape = (req.batch, req.kv_heads, req.kv_len, req.head_dim)

    def gather():
        k = k_rows.index_select(0, index).view(shape)
        return k, (k if req.v is req.k else v_rows.index_select(0, index).view(shape))  # MLA: one latent pool
    return gather


def contiguous(req: AttentionRequest, k: torch.Tensor, v: torch.Tensor) -> AttentionRequest:
    """The same request over gathered BHSD K and V: no block table, the same lengths, mask and scale."""
    return dataclasses.replace(req, k=k, v=v, block_table=None)


def bhsd_strides(t: torch.Tensor, paged: bool) -> tuple[int, int, int, int]:
    """Strides a kernel walks K or V by, as (sequence or page, kv head, key, dim): a pool [pages, slot, Hkv, D]
    gives (page, head, slot, dim) strides, a BHSD tensor its own."""
    s = t.stride()
    return (s[0], s[2], s[1], s[3]) if paged else tuple(s)
