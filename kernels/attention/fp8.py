"""FP8 KV caches (e4m3, as vLLM's kv_cache_dtype=fp8 and FlashInfer's decode take them): the checks of the codes and
their scales, the dequantization naive attention runs (K in its scores' precision, V in q's dtype), and the reason the
SDPA and flex routes refuse them.

K and V (MLA: the latent) hold torch.float8_e4m3fn codes; a key's value is float(code) x its scale, a float32 tensor of
shape [] (one scale per tensor) or [Hkv] (one per KV head), k_scale for K and v_scale for V. A paged cache's pools hold
codes in the same layout. The Triton decode kernels read the codes' bytes and convert them in their K/V loop, the
scales folded into the score scale (K) and the output (V): per tensor or per head, a scale is constant along a
program's keys, so it factors out of both dot products exactly.
"""

from __future__ import annotations

import dataclasses

import torch

from ..triton_mode import fp8_refusal

FP8_DTYPE = torch.float8_e4m3fn
E4M3_MAX = 448.0  # the largest finite e4m3 (fn) value: amax / E4M3_MAX is the scale that uses the whole range
SDPA_REFUSAL = ("PyTorch SDPA (and flash_attn's Python API) takes no float8_e4m3fn K/V with per-tensor or per-head "
                "scales: an fp8 KV cache is read by naive (dequantized first) and triton (decoded in its K/V loop)")
FLEX_REFUSAL = ("flex_attention computes in q's dtype and takes no fp8 K/V with scales (dequantizing the cache first "
                "would time a copy, not fp8 reads): naive and triton read an fp8 KV cache")


def triton_refusal(device: torch.device) -> str | None:
    """Why the Triton kernels cannot decode fp8 codes on `device` (a GPU before sm_89), else None."""
    return fp8_refusal(device, "naive reads the fp8 cache here")


def _bad(arg: str, rule: str) -> ValueError:
    return ValueError(f"{arg}: {rule}")


def check_kv_dtypes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_scale, v_scale, kv_heads: int,
                    names: tuple[str, str, str, str] = ("k", "v", "k_scale", "v_scale")) -> bool:
    """True for an fp8 cache (K and V float8_e4m3fn, with valid scales), False for a cache in q's dtype (no scales);
    else a one-line ValueError. `names`: how the caller calls K, V and their scales."""
    k_name, v_name, ks_name, vs_name = names
    both = f"{k_name}/{v_name}" if k_name != v_name else k_name
    if k.dtype == FP8_DTYPE or v.dtype == FP8_DTYPE:
        if k.dtype != v.dtype:
            raise _bad(both, f"an fp8 cache holds K and V as float8_e4m3fn both, got {k.dtype} and {v.dtype}")
        if q.dtype == FP8_DTYPE:
            raise _bad("q", "must be a floating dtype (float16/bfloat16/float32/float64); only the cache is fp8")
        for name, scale in dict.fromkeys(((ks_name, k_scale), (vs_name, v_scale))):
            check_scale(name, scale, q, kv_heads)
        return True
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise _bad(both, f"dtype must match q ({q.dtype}), or be float8_e4m3fn with scales, got {k.dtype} and "
                         f"{v.dtype}")
    for name, scale in ((ks_name, k_scale), (vs_name, v_scale)):
        if scale is not None:
            raise _bad(name, f"applies to a float8_e4m3fn cache only, got a {k.dtype} cache")
    return False


def check_scale(name: str, scale, q: torch.Tensor, kv_heads: int) -> None:
    """A float32 scale of shape [] or [kv_heads] on q's device, finite and positive; else a one-line ValueError."""
    shapes = f"[] (per tensor) or [Hkv]=[{kv_heads}] (per KV head)" if kv_heads > 1 else "[] (per tensor)"
    if scale is None:
        raise _bad(name, f"a float8_e4m3fn cache needs its scale: a float32 tensor of shape {shapes}")
    if not isinstance(scale, torch.Tensor):
        raise _bad(name, f"must be a float32 tensor of shape {shapes}, got {type(scale).__name__}")
    if scale.dtype != torch.float32:
        raise _bad(name, f"must have dtype float32, got {scale.dtype}")
    if tuple(scale.shape) not in ((), (kv_heads,)):
        raise _bad(name, f"must have shape {shapes}, got {tuple(scale.shape)}")
    if scale.device != q.device:
        raise _bad(name, f"device must match q ({q.device}), got {scale.device}")
    if not bool(((scale > 0) & torch.isfinite(scale)).all()):
        raise _bad(name, f"must be finite and positive, got {scale.tolist()}")


def scale_stride(scale: torch.Tensor) -> int:
    """What a kernel steps a scale pointer by per KV head: 0 for one scale per tensor, 1 for one per head."""
    return 1 if scale.dim() == 1 and scale.shape[0] > 1 else 0


def codes(t: torch.Tensor) -> torch.Tensor:
    """An fp8 cache as the bytes a Triton kernel loads (a masked load cannot fill fp8; the kernel bitcasts them)."""
    return t.view(torch.uint8) if t.dtype == FP8_DTYPE else t


def dequantize(cache: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, heads_dim: int) -> torch.Tensor:
    """float(code) x scale in fp32 (fp64 for an fp64 `dtype`), rounded once to `dtype`; a per-head scale along
    dimension `heads_dim` of the cache (1 in BHSD, 2 in a pool of pages)."""
    wide = torch.promote_types(dtype, torch.float32)
    shape = [1] * cache.dim()
    if scale.dim() == 1:
        shape[heads_dim] = scale.shape[0]
    return (cache.to(wide) * scale.to(wide).view(shape)).to(dtype)


def dequantized(req):
    """An AttentionRequest over an fp8 cache as the same request without scales, what naive attention computes on: K
    decoded in its scores' precision (fp32, fp64 for an fp64 q: rounded to bf16, a key would move a logit of 100 by
    0.2), V decoded and rounded to q's dtype, the dtype of its P.V product. A contiguous cache or gathered pages
    (BHSD); a pool is decoded whole."""
    heads_dim = 2 if req.paged else 1
    k = dequantize(req.k, req.k_scale, torch.promote_types(req.dtype, torch.float32), heads_dim)
    v = dequantize(req.v, req.v_scale, req.dtype, heads_dim)
    return dataclasses.replace(req, k=k, v=v, k_scale=None, v_scale=None)
