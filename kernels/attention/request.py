"""Validation of an attention call into one checked, immutable request."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..registry import add_operator

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True)
class AttentionRequest:
    """A validated call: tensors in BHSD layout plus the derived sizes."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    causal: bool
    scale: float
    cache_seqlens: torch.Tensor | None
    seqlens: tuple[int, ...] | None  # host copy of cache_seqlens, read once here

    @property
    def batch(self) -> int:
        return self.q.shape[0]

    @property
    def q_heads(self) -> int:
        return self.q.shape[1]

    @property
    def kv_heads(self) -> int:
        return self.k.shape[1]

    @property
    def q_len(self) -> int:
        return self.q.shape[2]

    @property
    def kv_len(self) -> int:
        return self.k.shape[2]

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


def validate(q, k, v, *, causal=False, scale=None, cache_seqlens=None) -> AttentionRequest:
    """Check the arguments of `attention` and return the request, or raise a one-line ValueError."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise _bad(name, f"must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise _bad(name, f"must have rank 4 (BHSD layout), got shape {tuple(t.shape)}")
        if t.dtype not in FLOAT_DTYPES:
            raise _bad(name, f"must be a floating dtype (float16/bfloat16/float32/float64), got {t.dtype}")
        if 0 in t.shape:
            raise _bad(name, f"must not have an empty dimension, got shape {tuple(t.shape)}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise _bad("k/v", f"dtype must match q ({q.dtype}), got k {k.dtype} and v {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise _bad("k/v", f"device must match q ({q.device}), got k {k.device} and v {v.device}")
    if k.shape != v.shape:
        raise _bad("v", f"shape must equal k's {tuple(k.shape)}, got {tuple(v.shape)}")
    if k.shape[0] != q.shape[0]:
        raise _bad("k", f"batch must equal q's ({q.shape[0]}), got {k.shape[0]}")
    if k.shape[3] != q.shape[3]:
        raise _bad("k", f"head dim must equal q's ({q.shape[3]}), got {k.shape[3]}")
    if q.shape[1] % k.shape[1] != 0:
        raise _bad("q", f"heads must be a multiple of kv heads (Hq % Hkv == 0), got Hq={q.shape[1]} Hkv={k.shape[1]}")
    if not isinstance(causal, bool):
        raise _bad("causal", f"must be a bool, got {type(causal).__name__}")
    if scale is None:
        scale = q.shape[3] ** -0.5
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise _bad("scale", f"must be a positive finite number or None, got {scale!r}")
    q_len, kv_len = q.shape[2], k.shape[2]
    seqlens = None
    if cache_seqlens is not None:
        seqlens = _check_seqlens(cache_seqlens, q, kv_len, q_len, causal)
    elif causal and q_len > kv_len:
        raise _bad("q", f"q_len must not exceed kv_len with causal=True (bottom-right mask), got {q_len} > {kv_len}")
    return AttentionRequest(q, k, v, causal, float(scale), cache_seqlens, seqlens)


def _check_seqlens(cache_seqlens, q, kv_len: int, q_len: int, causal: bool) -> tuple[int, ...]:
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
        if n > kv_len:
            raise _bad("cache_seqlens", f"cache_seqlens[{b}]={n} is above the KV length Sk={kv_len}")
        if n < low:
            need = "q_len (causal: every query needs a key)" if causal else "1"
            raise _bad("cache_seqlens", f"cache_seqlens[{b}]={n} is below {need}={low}")
    return seqlens


def call_plugin(fn, req: AttentionRequest):
    """A user's attention function, called with the operator's convention."""
    return fn(req.q, req.k, req.v, causal=req.causal, scale=req.scale, cache_seqlens=req.cache_seqlens)


add_operator("attention", call_plugin)
