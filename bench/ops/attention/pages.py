"""A paged case's KV cache as a server holds it: a pool of pages in shuffled order, its block table, and the
keys read back in order for the reference (a gather of its own, independent of the kernels')."""

from __future__ import annotations

import torch

from .cases import AttentionCase

TABLE_BYTES = 4  # one int32 block-table entry


def make_pages(case: AttentionCase, gen: torch.Generator, dtype: torch.dtype, device: torch.device, pools: int = 2):
    """K and V pools [num_pages, page_size, Hkv, D] of standard-normal values (the tail of a sequence's last page
    too: it must never be read) and the int32 block table [B, max_pages]: each sequence holds ceil(length /
    page_size) pages, drawn as a seeded permutation of the whole pool (a long-running server's fragmentation); the
    pool has one page more, which no sequence holds, and the entries past a sequence's pages name it (a freed page a
    server's table may still point at: the gate fills it with NaN, so a kernel that reads through those entries
    fails). `pools=1`: one pool (MLA's latent) and the table."""
    total = sum(case.pages)
    shape = (total + 1, case.page_size, case.kv_heads, case.head_dim)
    drawn = [torch.randn(shape, generator=gen, device=device, dtype=dtype) for _ in range(pools)]
    order = torch.randperm(total + 1, generator=gen, device=device).to(torch.int32)
    table = torch.full((case.batch, case.max_pages), int(order[total]), dtype=torch.int32, device=device)
    start = 0
    for b, count in enumerate(case.pages):
        table[b, :count] = order[start:start + count]
        start += count
    return (*drawn, table)


def keys_in_order(inputs, case: AttentionCase, start: int, stop: int, rows: slice = slice(None)):
    """K and V of keys [start, stop) of the sequences `rows` in BHSD order: a view of a contiguous cache, a copy
    gathered through the block table of a paged one (keys past a sequence's length come from its last page's tail or
    the spare page: the caller masks them)."""
    if not case.paged:
        return inputs.k[rows, :, start:stop], inputs.v[rows, :, start:stop]
    keys = torch.arange(start, stop, device=inputs.k.device)
    page = inputs.block_table[rows].to(torch.int64)[:, keys // case.page_size]  # [b, keys]
    slot = (keys % case.page_size)[None, :]
    return inputs.k[page, slot].permute(0, 2, 1, 3), inputs.v[page, slot].permute(0, 2, 1, 3)


def held_slots(case: AttentionCase, table: torch.Tensor, num_pages: int) -> torch.Tensor:
    """bool [num_pages, page_size]: the slots of a pool that hold a key some sequence uses (key j < its length);
    the rest (the tail of each last page, pages no table entry names) a kernel must never read."""
    page, dev = case.page_size, table.device
    lengths = torch.tensor(case.lengths, dtype=torch.int64, device=dev)
    used = (lengths[:, None] - page * torch.arange(case.max_pages, device=dev)[None, :]).clamp(0, page)
    named = used > 0  # [B, max_pages]: the entries naming a page the sequence holds, and how many of its slots
    slots = torch.arange(page, device=dev)[None, :] < used[named][:, None]
    held = torch.zeros((num_pages, page), dtype=torch.int32, device=dev)
    held.index_add_(0, table[named].to(torch.int64), slots.to(torch.int32))  # a page two entries name: either's
    return held > 0


def pool_bytes(case: AttentionCase, elem: int) -> int:
    """The K and V pools as allocated (whole pages, the spare one too) and the block table."""
    return 2 * (sum(case.pages) + 1) * case.page_size * case.kv_heads * case.head_dim * elem \
        + TABLE_BYTES * case.batch * case.max_pages


def table_read_bytes(case: AttentionCase) -> int:
    """The block-table entries a kernel must read: one per page each sequence holds (with a sliding window, per page
    holding a key some query's window reaches)."""
    if not case.paged:
        return 0
    page = case.page_size
    return TABLE_BYTES * sum((n - 1) // page - (n - case.keys_read(n)) // page + 1 for n in case.lengths)


def gather_bytes(case: AttentionCase, elem: int) -> int:
    """What a gather route allocates in its call: contiguous K and V at the cache length, and its int64 row index
    (kernels/attention/paged.py)."""
    keys = case.batch * case.kv_heads * case.kv_len
    return keys * (2 * case.head_dim * elem + 8)
