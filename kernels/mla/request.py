"""Validation of an MLA decode call (DeepSeek's absorbed attention over a latent KV cache) into one request."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from ..attention.fp8 import FP8_DTYPE, check_kv_dtypes
from ..attention.request import AttentionRequest, validate
from ..registry import add_operator

LATENT_DIM = 576  # DeepSeek-V2/V3: kv_lora_rank 512 + qk_rope_head_dim 64
V_DIM = 512  # the value is the latent's first kv_lora_rank dims
MAX_Q_LEN = 2  # one token, or two with multi-token prediction (a speculative draft)


@dataclass(frozen=True)
class MLARequest:
    """A validated call: q [B, Hq, Sq, Dqk] against one latent head per token, [B, 1, Sk, Dqk] or pools of pages
    [num_pages, page_size, 1, Dqk] with a block table; the value is the latent's first v_dim dims. `attention` is the
    same call as an attention request over (latent, latent), bottom-right causal: what the shared masks, gathers and
    SDPA routes read."""

    attention: AttentionRequest
    v_dim: int

    @property
    def q(self) -> torch.Tensor:
        return self.attention.q

    @property
    def latent(self) -> torch.Tensor:
        return self.attention.k

    @property
    def latent_scale(self) -> torch.Tensor | None:
        """An fp8 latent's float32 scale (shape []), None for a latent in q's dtype."""
        return self.attention.k_scale

    def __getattr__(self, name):  # batch, q_heads, q_len, kv_len, head_dim, scale, seqlens, paged, page_size, ...
        if name == "attention":
            raise AttributeError(name)
        return getattr(self.attention, name)


def _bad(arg: str, rule: str) -> ValueError:
    return ValueError(f"{arg}: {rule}")


def validate_mla(q, latent, *, scale, v_dim=V_DIM, cache_seqlens=None, block_table=None,
                 latent_scale=None) -> MLARequest:
    """Check the arguments of `mla_decode` and return the request, or raise a one-line ValueError. An fp8 latent
    cache holds float8_e4m3fn codes with `latent_scale`, one float32 scale of shape [] (attention's fp8 rules)."""
    for name, t in (("q", q), ("latent", latent)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise _bad(name, f"must be a rank-4 tensor ({'[B, Hq, Sq, D]' if name == 'q' else _layout(block_table)}), "
                             f"got {shape}")
    heads = latent.shape[2] if block_table is not None else latent.shape[1]
    if heads != 1:
        raise _bad("latent", f"must hold one latent head per token (MLA), got {heads} heads: {_layout(block_table)}")
    if q.shape[3] != latent.shape[3]:
        raise _bad("q", f"head dim must be the latent's ({latent.shape[3]}: the rope dims absorbed beside the "
                        f"compressed ones), got {q.shape[3]}")
    if isinstance(v_dim, bool) or not isinstance(v_dim, int) or not 0 < v_dim < latent.shape[3]:
        raise _bad("v_dim", f"must be an int in [1, {latent.shape[3] - 1}] (the latent's first dims are the value), "
                            f"got {v_dim!r}")
    if not 1 <= q.shape[2] <= MAX_Q_LEN:
        raise _bad("q", f"must hold 1 or {MAX_Q_LEN} query tokens per sequence (decode, or multi-token prediction), "
                        f"got {q.shape[2]}")
    if scale is None or isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) \
            or scale <= 0:
        raise _bad("scale", f"must be a positive finite number (MLA's is 1/sqrt(qk_nope + qk_rope dims), not the "
                            f"latent's), got {scale!r}")
    if isinstance(latent_scale, torch.Tensor) and latent_scale.dim() != 0:
        raise _bad("latent_scale", f"must have shape [] (one scale for the latent cache), got "
                                   f"{tuple(latent_scale.shape)}")
    if latent.dtype == FP8_DTYPE or latent_scale is not None:  # the latent's own names in the one-line errors
        check_kv_dtypes(q, latent, latent, latent_scale, latent_scale, 1,
                        names=("latent", "latent", "latent_scale", "latent_scale"))
    req = validate(q, latent, latent, causal=True, scale=scale, cache_seqlens=cache_seqlens, block_table=block_table,
                   k_scale=latent_scale, v_scale=latent_scale)
    return MLARequest(req, v_dim)


def _layout(block_table) -> str:
    return "[num_pages, page_size, 1, D] with a block_table" if block_table is not None else "[B, 1, Sk, D]"


def value_request(req: MLARequest, k: torch.Tensor) -> AttentionRequest:
    """The attention request over a contiguous latent `k` [B, 1, Sk, Dqk] with the value its first v_dim dims (fp8 codes
    keep the latent's scale for K and V alike; a latent in q's dtype has none)."""
    scales = {} if k.dtype == FP8_DTYPE else {"k_scale": None, "v_scale": None}  # a decoded latent has none
    return dataclasses.replace(req.attention, k=k, v=k[..., :req.v_dim], block_table=None, **scales)


def call_plugin(fn, req: MLARequest):
    """A user's MLA function, called with the operator's convention (block_table= for a paged latent cache)."""
    paged = {"block_table": req.block_table} if req.paged else {}
    if req.kv_fp8:
        paged["latent_scale"] = req.latent_scale
    return fn(req.q, req.latent, scale=req.scale, v_dim=req.v_dim, cache_seqlens=req.cache_seqlens, **paged)


add_operator("mla", call_plugin)
