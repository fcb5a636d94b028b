"""Validation of an attention call into one checked, immutable request (contiguous or paged KV cache)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..registry import add_operator
from .fp8 import FP8_DTYPE, check_kv_dtypes

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True)
class AttentionRequest:
    """A validated call: q in BHSD layout, K/V in BHSD or, with a block table, pools of pages
    [num_pages, page_size, Hkv, D]; plus the derived sizes."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    causal: bool
    scale: float
    cache_seqlens: torch.Tensor | None
    seqlens: tuple[int, ...] | None  # host copy of cache_seqlens, read once here
    block_table: torch.Tensor | None = None  # int32 [B, max_pages]: sequence b's key j is in page [b, j // page_size]
    # FlashInfer's window: the query at position i (bottom-right: L - Sq + row) sees keys j >= i - window_left; -1: none
    window_left: int = -1
    sinks: torch.Tensor | None = None  # float32 [Hq]: a logit per head that joins the softmax denominator (gpt-oss)
    # an fp8 cache (K/V float8_e4m3fn): float32 scales of shape [] or [Hkv], value = float(code) x scale (fp8.py)
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None

    @property
    def kv_fp8(self) -> bool:
        """True when K/V hold float8_e4m3fn codes with their scales."""
        return self.k_scale is not None

    @property
    def windowed(self) -> bool:
        return self.window_left >= 0

    @property
    def paged(self) -> bool:
        return self.block_table is not None

    @property
    def page_size(self) -> int:
        """Tokens per page (0 for a contiguous cache)."""
        return self.k.shape[1] if self.paged else 0

    @property
    def num_pages(self) -> int:
        return self.k.shape[0] if self.paged else 0

    @property
    def batch(self) -> int:
        return self.q.shape[0]

    @property
    def q_heads(self) -> int:
        return self.q.shape[1]

    @property
    def kv_heads(self) -> int:
        return self.k.shape[2 if self.paged else 1]

    @property
    def q_len(self) -> int:
        return self.q.shape[2]

    @property
    def kv_len(self) -> int:
        """The cache length: keys per sequence (a paged cache: its block table's pages x page_size)."""
        return self.block_table.shape[1] * self.k.shape[1] if self.paged else self.k.shape[2]

    @property
    def head_dim(self) -> int:
        return self.q.shape[3]

    @property
    def device_type(self) -> str:
        return self.q.device.type

    @property
    def dtype(self) -> torch.dtype:
        return self.q.dtype

    @property
    def ragged(self) -> bool:
        """True when some sequence uses fewer keys than the cache holds."""
        return self.seqlens is not None and any(n != self.kv_len for n in self.seqlens)


def _bad(arg: str, rule: str) -> ValueError:
    return ValueError(f"{arg}: {rule}")


def validate(q, k, v, *, causal=False, scale=None, cache_seqlens=None, block_table=None, window_left=-1,
             sinks=None, k_scale=None, v_scale=None) -> AttentionRequest:
    """Check the arguments of `attention` and return the request, or raise a one-line ValueError.

    With `block_table`, k and v are pools of pages [num_pages, page_size, Hkv, D] and the table (int32
    [B, max_pages]) names the page of each block of page_size keys of each sequence. `window_left` (-1: none) and
    `sinks` (float32 [Hq]) as in AttentionRequest; k and v may be float8_e4m3fn codes with `k_scale` and `v_scale`
    (float32, shape [] or [Hkv]: fp8.py)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise _bad(name, f"must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            layout = "[num_pages, page_size, Hkv, D] with a block_table" if block_table is not None and name != "q" \
                else "BHSD layout"
            raise _bad(name, f"must have rank 4 ({layout}), got shape {tuple(t.shape)}")
        if t.dtype not in FLOAT_DTYPES and (name == "q" or t.dtype != FP8_DTYPE):
            also = "" if name == "q" else ", or float8_e4m3fn with its scale"
            raise _bad(name, f"must be a floating dtype (float16/bfloat16/float32/float64{also}), got {t.dtype}")
        if 0 in t.shape:
            raise _bad(name, f"must not have an empty dimension, got shape {tuple(t.shape)}")
    if k.device != q.device or v.device != q.device:
        raise _bad("k/v", f"device must match q ({q.device}), got k {k.device} and v {v.device}")
    if k.shape != v.shape:
        raise _bad("v", f"shape must equal k's {tuple(k.shape)}, got {tuple(v.shape)}")
    paged = block_table is not None
    if not paged and k.shape[0] != q.shape[0]:
        raise _bad("k", f"batch must equal q's ({q.shape[0]}), got {k.shape[0]}")
    if k.shape[3] != q.shape[3]:
        raise _bad("k", f"head dim must equal q's ({q.shape[3]}), got {k.shape[3]}")
    kv_heads = k.shape[2] if paged else k.shape[1]
    if q.shape[1] % kv_heads != 0:
        raise _bad("q", f"heads must be a multiple of kv heads (Hq % Hkv == 0), got Hq={q.shape[1]} Hkv={kv_heads}")
    if not check_kv_dtypes(q, k, v, k_scale, v_scale, kv_heads):
        k_scale = v_scale = None
    if not isinstance(causal, bool):
        raise _bad("causal", f"must be a bool, got {type(causal).__name__}")
    if scale is None:
        scale = q.shape[3] ** -0.5
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise _bad("scale", f"must be a positive finite number or None, got {scale!r}")
    if paged:
        _check_table_shape(block_table, q)
    q_len = q.shape[2]
    kv_len = block_table.shape[1] * k.shape[1] if paged else k.shape[2]
    seqlens = None
    if cache_seqlens is not None:
        pages = (block_table.shape[1], k.shape[1]) if paged else None
        seqlens = _check_seqlens(cache_seqlens, q, kv_len, q_len, causal, pages)
    elif causal and q_len > kv_len:
        raise _bad("q", f"q_len must not exceed kv_len with causal=True (bottom-right mask), got {q_len} > {kv_len}")
    if paged:
        _check_pages(block_table, k.shape[0], k.shape[1], seqlens or (kv_len,) * q.shape[0])
    window_left = check_window(window_left)
    _check_sinks(sinks, q)
    return AttentionRequest(q, k, v, causal, float(scale), cache_seqlens, seqlens, block_table, window_left, sinks,
                            k_scale, v_scale)


def check_window(window_left) -> int:
    """window_left as an int >= -1 (-1: no window), or a one-line ValueError."""
    if isinstance(window_left, bool) or not isinstance(window_left, int) or window_left < -1:
        raise _bad("window_left", f"must be an int >= -1 (-1: no window), got {window_left!r}")
    return int(window_left)


def _check_sinks(sinks, q) -> None:
    if sinks is None:
        return
    if not isinstance(sinks, torch.Tensor):
        raise _bad("sinks", f"must be a float32 tensor of shape [Hq], got {type(sinks).__name__}")
    if sinks.dtype != torch.float32:
        raise _bad("sinks", f"must have dtype float32, got {sinks.dtype}")
    if sinks.dim() != 1 or sinks.shape[0] != q.shape[1]:
        raise _bad("sinks", f"must have shape [Hq]=[{q.shape[1]}] (one logit per query head), got "
                            f"{tuple(sinks.shape)}")
    if sinks.device != q.device:
        raise _bad("sinks", f"device must match q ({q.device}), got {sinks.device}")


def _check_table_shape(table, q) -> None:
    if not isinstance(table, torch.Tensor):
        raise _bad("block_table", f"must be an int32 tensor of shape [B, max_pages], got {type(table).__name__}")
    if table.dtype != torch.int32:
        raise _bad("block_table", f"must have dtype int32, got {table.dtype}")
    if table.dim() != 2 or table.shape[0] != q.shape[0] or table.shape[1] < 1:
        raise _bad("block_table", f"must have shape [B, max_pages] with B={q.shape[0]}, max_pages >= 1, "
                                  f"got {tuple(table.shape)}")
    if table.device != q.device:
        raise _bad("block_table", f"device must match q ({q.device}), got {table.device}")


def _check_pages(table: torch.Tensor, num_pages: int, page_size: int, lengths: tuple[int, ...]) -> None:
    """Every entry a sequence reads (the first ceil(length / page_size) of its row) names a page of the pool;
    the entries past them are never read and may hold anything (-1 padding, say)."""
    needed = torch.tensor([-(-n // page_size) for n in lengths], device=table.device)
    used = torch.arange(table.shape[1], device=table.device)[None, :] < needed[:, None]
    bad = used & ((table < 0) | (table >= num_pages))
    if bool(bad.any()):
        b, i = (int(x) for x in bad.nonzero()[0].tolist())
        raise _bad("block_table", f"entry [{b}, {i}] = {int(table[b, i])} is outside the pool's pages "
                                  f"[0, {num_pages})")


def _check_seqlens(cache_seqlens, q, kv_len: int, q_len: int, causal: bool,
                   pages: tuple[int, int] | None) -> tuple[int, ...]:
    if not isinstance(cache_seqlens, torch.Tensor):
        raise _bad("cache_seqlens", f"must be an int32 tensor of shape [B], got {type(cache_seqlens).__name__}")
    if cache_seqlens.dtype != torch.int32:
        raise _bad("cache_seqlens", f"must have dtype int32, got {cache_seqlens.dtype}")
    if cache_seqlens.dim() != 1 or cache_seqlens.shape[0] != q.shape[0]:
        raise _bad("cache_seqlens", f"must have shape [B]=[{q.shape[0]}], got {tuple(cache_seqlens.shape)}")
    if cache_seqlens.device != q.device:
        raise _bad("cache_seqlens", f"device must match q ({q.device}), got {cache_seqlens.device}")
    seqlens = tuple(int(n) for n in cache_seqlens.tolist())
    low = q_len if causal else 1
    for b, n in enumerate(seqlens):
        if n > kv_len and pages:
            raise _bad("block_table", f"row {b} holds {pages[0]} pages of {pages[1]} tokens ({kv_len} keys), too "
                                      f"few for cache_seqlens[{b}]={n}")
        if n > kv_len:
            raise _bad("cache_seqlens", f"cache_seqlens[{b}]={n} is above the KV length Sk={kv_len}")
        if n < low:
            need = "q_len (causal: every query needs a key)" if causal else "1"
            raise _bad("cache_seqlens", f"cache_seqlens[{b}]={n} is below {need}={low}")
    return seqlens


def call_plugin(fn, req: AttentionRequest):
    """A user's attention function, called with the operator's convention (and block_table= for a paged cache,
    window_left=, sinks=, k_scale= and v_scale= where the request has them)."""
    extra = {"block_table": req.block_table} if req.paged else {}
    if req.windowed:
        extra["window_left"] = req.window_left
    if req.sinks is not None:
        extra["sinks"] = req.sinks
    if req.kv_fp8:
        extra.update(k_scale=req.k_scale, v_scale=req.v_scale)
    return fn(req.q, req.k, req.v, causal=req.causal, scale=req.scale, cache_seqlens=req.cache_seqlens, **extra)


add_operator("attention", call_plugin)
