"""FlexAttention: torch.nn.attention.flex_attention compiled by Inductor (a C++ template on the host, a tiled Triton
kernel on CUDA, flex decoding where torch routes short queries), with phasebench's masks as mask mods.

The mask is a mask mod over (sequence b, head, query row, key): bottom-right causal (query row i sits at position
L_b - Sq + i), keys past each sequence's length L_b, FlashInfer's window (keys >= position - window_left); its
block mask is built once per plan, outside the call (its seconds in the call's `compiled.build_s`), and the kernel
skips the blocks it masks whole. GQA: `enable_gqa` (K/V never repeated). A paged cache is read in place: each pool
[num_pages, page_size, Hkv, D] is one key sequence of num_pages * page_size slots (a view, batch 1: flex
broadcasts it), every query sequence
masks in the slots of its own pages (a page's logical index from an inverse of the block table), and the block
mask's key blocks are the pages, so a sequence's kernel visits its own pages only. Sinks: FlexAttention's
log-sum-exp (CUDA: q, k, v upcast to fp32 in the call and the output rescaled by sigmoid(lse - sink), as the host's
flash route does); torch 2.13's host template returns no log-sum-exp, so sinks are unsupported there.
The mask mods are made by module-level factories, so that a new plan of the same case meets Dynamo's guards and
reuses the compiled graph.
flex reads every slot of a key block its mask keeps in part and multiplies a masked slot's value by a probability of
0, so a stale NaN past a sequence's length (a server's pool) would reach the output: a ragged or paged call first
writes zeros into those value slots, the ones past each length inside its last kept block (the slots a server
reserves for the sequence's next tokens; never a slot any sequence reads), inside the call (`+tails-zeroed`).
"""

from __future__ import annotations

import functools
import time

import torch

from .. import inductor
from ..errors import Unsupported
from ..registry import Impl, PlannedCall, add_builtin, dtype_name
from .fp8 import FLEX_REFUSAL
from .request import AttentionRequest

# Block sizes (query rows, keys) of the block mask, which the kernel tiles by, for short queries (decode, verify: up to
# SHORT_QUERY rows) and for longer ones; a paged cache's key block is its page. The host's were timed against SDPA's
# flash route on llama-3-8b's shapes (docs/kernels.md#flexattention-and-compiled): decode is fastest on long key tiles,
# a causal prefill on small tiles that skip the masked half finely; CUDA keeps torch's defaults (untimed here).
BLOCK = {"cpu": {"short": (32, 256), "long": (32, 64)}, "cuda": {"short": (128, 128), "long": (128, 128)}}
SHORT_QUERY = 16
# A paged cache's key block is its page: on CUDA Inductor's flex kernel needs key blocks in multiples of its key tile
# (128 in the default mode; flex decoding's own rule is not checked here: no GPU was lent), on the host any page
PAGE_MULTIPLE = {"cpu": 1, "cuda": 128}


@functools.cache
def flex_module():
    """torch.nn.attention.flex_attention, or None where this torch has none."""
    try:
        from torch.nn.attention import flex_attention
    except ImportError:
        return None
    return flex_attention


def _within(keep, key, position, causal: bool, window_left: int):
    """`keep` and, bottom-right causal, keys up to the query's position, and, windowed, keys from its window's start."""
    if causal:
        keep = keep & (key <= position)
    if window_left >= 0:
        keep = keep & (key >= position - window_left)
    return keep


def _dense_mask(q_len: int, causal: bool, window_left: int, lengths: torch.Tensor | None, kv_len: int):
    """Keys kept for query row q of sequence b of a contiguous cache (lengths None: every sequence holds kv_len)."""
    def mask(b, h, q_idx, kv_idx):
        end = lengths[b] if lengths is not None else kv_len
        return _within(kv_idx < end, kv_idx, q_idx + end - q_len, causal, window_left)
    return mask


def _paged_mask(q_len: int, causal: bool, window_left: int, lengths: torch.Tensor, logical: torch.Tensor,
                page: int):
    """Slots kept for query row q of sequence b of a pool read in place: `logical[b, p]` is page p's index in
    sequence b's table (-1: not its page), a slot's key its page index x page + its offset."""
    def mask(b, h, q_idx, kv_idx):
        index = logical[b, kv_idx // page]
        key = index * page + kv_idx % page
        return _within((index >= 0) & (key < lengths[b]), key, q_idx + lengths[b] - q_len, causal, window_left)
    return mask


def _lengths(req: AttentionRequest) -> torch.Tensor:
    return req.cache_seqlens if req.cache_seqlens is not None else torch.full(
        (req.batch,), req.kv_len, dtype=torch.int32, device=req.q.device)


def _logical_pages(req: AttentionRequest, lengths: torch.Tensor) -> torch.Tensor:
    """int32 [B, num_pages]: the index of pool page p in sequence b's table, -1 where b does not read it (the table's
    entries past a sequence's pages, which may hold anything, are never taken)."""
    dev, pages = req.q.device, req.num_pages
    needed = (lengths.to(torch.int64) + req.page_size - 1) // req.page_size
    slots = torch.arange(req.block_table.shape[1], device=dev)
    used = slots[None, :] < needed[:, None]
    rows = torch.arange(req.batch, device=dev)[:, None].expand_as(used)[used]
    for b in range(req.batch):
        row = req.block_table[b][used[b]]
        if row.unique().numel() != row.numel():
            raise Unsupported(f"flex reads a pool through an inverse of the block table: sequence {b} lists a page "
                              "twice, which gives it two positions")
    logical = torch.full((req.batch, pages), -1, dtype=torch.int32, device=dev)
    logical[rows, req.block_table[used].long()] = slots[None, :].expand_as(used)[used].to(torch.int32)
    return logical


def tail_rows(req: AttentionRequest, block: int) -> torch.Tensor | None:
    """int64 indices of the V rows (of D elements: a contiguous cache's [B * Hkv * Sk], a pool's
    [num_pages * page_size * Hkv]) that lie past a sequence's length inside a key block its mask keeps in part
    (`block` keys; a pool's blocks are its pages), or None where there is none. flex reads every slot of such a
    block and multiplies a masked one's value by a probability of 0: a stale NaN there would reach the output (a
    masked key's NaN score is replaced by the mask, so K needs nothing)."""
    if not req.ragged and not req.paged:
        return None
    dev, heads = req.q.device, req.kv_heads
    lengths = req.seqlens or (req.kv_len,) * req.batch
    if req.paged:
        tokens = _pool_tails(req, torch.tensor(lengths, device=dev))
        if tokens is None:
            return None
        return (tokens[:, None] * heads + torch.arange(heads, device=dev)[None, :]).reshape(-1)
    rows = []
    for b, n in enumerate(lengths):
        end = min(-(-n // block) * block, req.kv_len)
        if end > n:
            slots = torch.arange(n, end, device=dev)
            rows.append(((b * heads + torch.arange(heads, device=dev)[:, None]) * req.kv_len + slots[None, :])
                        .reshape(-1))
    return torch.cat(rows) if rows else None


def _pool_tails(req: AttentionRequest, lengths: torch.Tensor) -> torch.Tensor | None:
    """The pool's token rows past what any sequence reads of a page some sequence ends inside: a page that several
    sequences read (a fork's shared prefix, a page listed twice) keeps every slot one of them reads."""
    page, dev = req.page_size, req.q.device
    count = (lengths + page - 1) // page
    slots = torch.arange(req.block_table.shape[1], device=dev)
    used = slots[None, :] < count[:, None]
    fill = (lengths[:, None] - slots[None, :] * page).clamp(0, page)
    filled = torch.zeros(req.num_pages, dtype=torch.int64, device=dev).scatter_reduce(
        0, req.block_table[used].long(), fill[used], "amax")
    ends = lengths % page != 0
    last = req.block_table[torch.arange(req.batch, device=dev)[ends], count[ends] - 1].long().unique()
    rows = [p * page + torch.arange(int(filled[p]), page, device=dev) for p in last.tolist() if filled[p] < page]
    return torch.cat(rows) if rows else None


def _pool_view(pool: torch.Tensor) -> torch.Tensor:
    """A pool [num_pages, page_size, H, D] as one sequence [1, H, num_pages * page_size, D] (a view)."""
    pages, size, heads, dim = pool.shape
    return pool.view(1, pages * size, heads, dim).transpose(1, 2)


def block_sizes(req: AttentionRequest, device_type: str) -> tuple[int, int]:
    """The (query rows, keys) tile of a request on a device type (BLOCK)."""
    return BLOCK[device_type]["short" if req.q_len <= SHORT_QUERY else "long"]


def block_mask_of(req: AttentionRequest, keys: int, device_type: str):
    """The request's block mask over `keys` key slots, in its block sizes."""
    fa = flex_module()
    q_block, k_block = block_sizes(req, device_type)
    if req.paged:
        lengths = _lengths(req)
        mask = _paged_mask(req.q_len, req.causal, req.window_left, lengths, _logical_pages(req, lengths),
                           req.page_size)
        if req.page_size % PAGE_MULTIPLE[device_type]:
            raise Unsupported(f"flex on {device_type} reads a page as one key block, which must be a multiple of "
                              f"{PAGE_MULTIPLE[device_type]} keys, got pages of {req.page_size}")
        return fa.create_block_mask(mask, B=req.batch, H=None, Q_LEN=req.q_len, KV_LEN=keys,
                                    device=req.q.device, BLOCK_SIZE=(q_block, req.page_size))
    # a dense request gets one too (every block full, its mask never evaluated): the blocks are the kernel's tiles
    lengths = req.cache_seqlens if req.ragged else None
    mask = _dense_mask(req.q_len, req.causal, req.window_left, lengths, req.kv_len)
    return fa.create_block_mask(mask, B=req.batch if lengths is not None else None, H=None, Q_LEN=req.q_len,
                                KV_LEN=keys, device=req.q.device, BLOCK_SIZE=(q_block, k_block))


def _flex_body(q, k, v, block_mask, scale, enable_gqa):
    from torch.nn.attention.flex_attention import flex_attention  # traced by Dynamo: no cached lookup in a body

    return flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa)


def _flex_sink_body(q, k, v, block_mask, scale, enable_gqa, sinks, dtype):
    from torch.nn.attention.flex_attention import AuxRequest, flex_attention

    out, aux = flex_attention(q.float(), k.float(), v.float(), block_mask=block_mask, scale=scale,
                              enable_gqa=enable_gqa, return_aux=AuxRequest(lse=True))
    # Z / (Z + exp(sink)) with Z = exp(lse): the sink's share leaves the denominator, then one rounding
    return (out * torch.sigmoid(aux.lse - sinks[None, :, None])[..., None]).to(dtype)


def plan_flex(req: AttentionRequest, impl: str = "flex", v: torch.Tensor | None = None) -> PlannedCall:
    """The compiled flex call of a validated request; `v` a value narrower than the key where given (MLA)."""
    device_type = req.device_type
    if req.sinks is not None and device_type == "cpu":
        raise Unsupported("flex on the host: torch's C++ flex template returns no log-sum-exp (return_aux), so it "
                          "cannot add a sink term (naive, flash and triton serve sinks)")
    start = time.perf_counter()
    if req.paged:
        k, v = _pool_view(req.k), _pool_view(req.v if v is None else v)
        keys = k.shape[2]
    else:
        k, v, keys = req.k, req.v if v is None else v, req.kv_len
    block_mask = block_mask_of(req, keys, device_type)
    tails = tail_rows(req, req.page_size if req.paged else block_sizes(req, device_type)[1])
    build_s = time.perf_counter() - start
    label = inductor.backend(device_type, "flex") + ("+paged" if req.paged else "")
    before = None
    if tails is not None:
        label += "+tails-zeroed"
        if not req.v.is_contiguous():
            raise Unsupported("flex zeroes the value slots past each length in place, which needs a contiguous V")
        values = req.v.view(-1, req.v.shape[-1])  # MLA's latent is its K too: zeroed once

        def before():
            values.index_fill_(0, tails, 0)
    gqa = req.kv_heads != req.q_heads
    if req.sinks is not None:
        return inductor.compiled_call(impl, label + "+fp32-lse-sink", _flex_sink_body, req.q, k, v, block_mask,
                                      req.scale, gqa, req.sinks, req.dtype, build_s=build_s, before=before)
    return inductor.compiled_call(impl, label, _flex_body, req.q, k, v, block_mask, req.scale, gqa, build_s=build_s,
                                  before=before)


def why_unavailable(device_type: str) -> str | None:
    if flex_module() is None:
        return f"torch {torch.__version__} has no torch.nn.attention.flex_attention"
    return inductor.why_unavailable(device_type)


FLEX = add_builtin(Impl(
    name="flex",
    summary="FlexAttention compiled by Inductor: phasebench's masks as mask mods over a block mask built per case, "
            "paged caches read in place",
    devices=frozenset({"cpu", "cuda"}),
    dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32}),
    plan=plan_flex,
    paged=True,
    window=True,
    sinks=True,  # on CUDA (its log-sum-exp); the host's template raises Unsupported when planned
    max_head_dim=1 << 16,
    unavailable=why_unavailable,
    backends=lambda device_type: inductor.backend(device_type, "flex"),
    fp8_refusal=FLEX_REFUSAL,
    # the sink route upcasts q, K and V and multiplies in fp32 (CUDA only); every other call its inputs' dtype
    compute=lambda device_type, dtype, fields: "float32" if device_type == "cuda" and fields.get("sinks")
    else dtype_name(dtype),
    compiles=True,
))
