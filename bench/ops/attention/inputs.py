"""The seeded inputs of an attention case (dense, ragged or paged), its large-logit stress inputs, and the NaN the gate
puts past each sequence's length."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from ...instruments.roofline import TORCH_DTYPES
from .cases import AttentionCase
from .pages import held_slots, make_pages

# Standard-normal q and k give logits of about +-4, where softmax without its max subtraction never overflows;
# q x 30 gives logits of about +-100 at a few thousand keys, past exp's float32/bfloat16 range (88.7) and far
# past float16's (11.1).
LOGIT_SCALE = 30.0
E4M3_NAN_CODE = 0x7F  # float8_e4m3fn's NaN (exponent and mantissa all ones)


@dataclass(frozen=True)
class CaseInputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cache_seqlens: torch.Tensor | None = None  # int32 [B] for a ragged case
    block_table: torch.Tensor | None = None  # int32 [B, max_pages] for a paged case (k, v are then its pools)
    sinks: torch.Tensor | None = None  # float32 [Hq] for a case with sinks
    k_scale: torch.Tensor | None = None  # an fp8 case's float32 scales [Hkv] (k and v then hold e4m3 codes)
    v_scale: torch.Tensor | None = None


def make_inputs(case: AttentionCase, device: torch.device, seed: int = 0) -> CaseInputs:
    """Standard-normal q, k, v in the case's dtype, from a fixed seed (never zeros); for a paged case, k and v are
    pools of pages in shuffled order with their block table (bench/ops/attention/pages.py); sinks drawn last."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = TORCH_DTYPES[case.dtype]

    def draw(heads, length):
        return torch.randn((case.batch, heads, length, case.head_dim), generator=gen, device=device, dtype=dtype)

    q = draw(case.q_heads, case.q_len)
    lens = None if case.seqlens is None else torch.tensor(case.seqlens, dtype=torch.int32, device=device)
    if case.paged:  # with cache_seqlens always, as a server calls it: kv_len need not fill the last page
        k, v, table = make_pages(case, gen, dtype, device)
        lens = torch.tensor(case.lengths, dtype=torch.int32, device=device)
        return fp8_cache(case, CaseInputs(q, k, v, cache_seqlens=lens, block_table=table,
                                          sinks=draw_sinks(case, gen, device)))
    k, v = draw(case.kv_heads, case.kv_len), draw(case.kv_heads, case.kv_len)
    return fp8_cache(case, CaseInputs(q, k, v, lens, sinks=draw_sinks(case, gen, device)))


def quantize_e4m3(t: torch.Tensor, heads_dim: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """float8_e4m3fn codes of `t` and their float32 scale amax / 448 (vLLM's calibration): one per index of
    `heads_dim` (a KV head), or one for the tensor (None)."""
    dims = [d for d in range(t.dim()) if d != heads_dim]
    amax = t.float().abs().amax(dim=dims) if heads_dim is not None else t.float().abs().amax()
    scale = (amax.clamp_min(torch.finfo(torch.float32).tiny) / 448.0).float()
    shape = [1] * t.dim()
    if heads_dim is not None:
        shape[heads_dim] = -1
    return (t.float() / scale.view(shape)).to(torch.float8_e4m3fn), scale


def fp8_cache(case: AttentionCase, inputs: CaseInputs) -> CaseInputs:
    """An fp8 case's K and V (contiguous or pools) quantized to e4m3 with a scale per KV head; others unchanged."""
    if case.kv_dtype != "fp8":
        return inputs
    heads_dim = 2 if case.paged else 1
    (k, k_scale), (v, v_scale) = (quantize_e4m3(t, heads_dim) for t in (inputs.k, inputs.v))
    return dataclasses.replace(inputs, k=k, v=v, k_scale=k_scale, v_scale=v_scale)


def draw_sinks(case: AttentionCase, gen: torch.Generator, device: torch.device) -> torch.Tensor | None:
    """float32 [Hq] sink logits that take a real share of the denominator: log(keys a query sees) + N(0, 1), so
    exp(sink) is about the sum of the exp(logits) of standard-normal inputs (a kernel that drops the sink errs by
    tens of percent, never within rounding), whatever the window or the length."""
    if not case.sinks:
        return None
    seen = min(case.lengths) if not case.windowed else min(min(case.lengths), case.window_left + 1)
    noise = torch.randn((case.q_heads,), generator=gen, device=device, dtype=torch.float32)
    return noise.add_(math.log(seen))


def fill_past_the_end(case: AttentionCase, caches, block_table: torch.Tensor | None = None,
                      value: float = float("nan")) -> None:
    """Fill what no sequence's keys hold in each cache tensor (K and V, or MLA's latent), in place: a ragged contiguous
    cache's keys j >= each length, a paged pool's slots past each length in its last page and the pages no entry
    names. A server's pool holds stale values there (FlashMLA's own test fills it with NaN)."""
    if case.paged:
        unread = ~held_slots(case, block_table, caches[0].shape[0])[:, :, None, None]
    elif case.ragged:
        lengths = torch.tensor(case.lengths, device=caches[0].device)
        unread = (torch.arange(case.kv_len, device=lengths.device)[None, :] >= lengths[:, None])[:, None, :, None]
    else:
        return
    for t in caches:
        if t.dtype == torch.float8_e4m3fn:  # fp8 has no masked_fill: its NaN code (0x7f) written as a byte
            t.view(torch.uint8).masked_fill_(unread, E4M3_NAN_CODE if value != value else int(torch.tensor(
                value).to(torch.float8_e4m3fn).view(torch.uint8)))
        else:
            t.masked_fill_(unread, value)


def poison_unread(case: AttentionCase, inputs: CaseInputs) -> None:
    """NaN past each sequence's length in K and V, before every judged call: a kernel that reads there (a masked
    score still multiplies its value: 0 x NaN is NaN) fails whatever the values a server's pool would hold."""
    fill_past_the_end(case, (inputs.k, inputs.v), inputs.block_table)


def large_logits(case: AttentionCase, inputs: CaseInputs) -> CaseInputs:
    """The same keys and values with q x LOGIT_SCALE: a kernel that skips softmax's max subtraction overflows."""
    return dataclasses.replace(inputs, q=inputs.q * LOGIT_SCALE)


def sequence_lengths(case: AttentionCase, inputs: CaseInputs) -> tuple[int, ...] | None:
    """Per-sequence KV lengths from the case, else from the inputs' cache_seqlens; None when every sequence is full."""
    lens = getattr(case, "seqlens", None)
    if lens is None and getattr(inputs, "cache_seqlens", None) is not None:
        lens = tuple(int(n) for n in inputs.cache_seqlens.tolist())
    if lens is not None and len(lens) != case.batch:
        raise ValueError(f"seqlens: must hold batch={case.batch} lengths, got {len(lens)}")
    return None if lens is None else tuple(lens)
