"""The attention of phasebench's reference decoder, by kind: GQA through SDPA, or through kernels.attention where a
layer has a sliding window or sinks (gpt-oss); MLA (DeepSeek) over a latent cache, absorbed through kernels.mla_decode
for decode and decompressed for prompts, as serving engines run it; and whether an impl can serve a model's kind."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from ...kernels import Unsupported, mla_decode, prepare, prepare_mla
from ...kernels import attention as kernel_attention
from ..spec.models import DecoderConfig
from ..spec.steps import MLA_ABSORBED_MAX
from .moe_block import bare_linear

NORM_EPS = 1e-6


@functools.cache
def sdpa_has_gqa() -> bool:
    """Whether this torch's scaled_dot_product_attention takes enable_gqa (torch >= 2.5)."""
    q, kv = torch.zeros(1, 2, 1, 4), torch.zeros(1, 1, 1, 4)
    try:
        F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
    except TypeError:
        return False
    return True


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32 (float64 stays float64), returned in x's dtype."""

    def __init__(self, hidden: int, device, dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(hidden, device=device, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + NORM_EPS)
        return (xf * self.weight.to(xf.dtype)).to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + rotate_half(x) * sin


@functools.lru_cache(maxsize=128)  # a 2048-token prompt in chunks of 64 has 32 shapes: all kept
def lower_right(t: int, kv_len: int, device: torch.device):
    """Bottom-right causal attention of t queries over kv_len keys, as flash attention does it: on CUDA SDPA's
    causal_lower_right (its flash kernel), on the host one boolean mask per shape, built once, not per call."""
    if device.type == "cuda":
        from torch.nn.attention.bias import causal_lower_right

        return causal_lower_right(t, kv_len)
    return torch.ones(t, kv_len, dtype=torch.bool, device=device).tril(kv_len - t)


class Attention(nn.Module):
    """Attention over the KV cache slice, a module of its own so a forward hook sees q/k/v as they are called.
    causal: each new token sees the cache before it and the new tokens up to itself (bottom-right aligned, so a
    chunk at a prefix offset or a verify pass sees its whole prefix). SDPA, or with a window (`window_left`) or
    `sink_heads` sink logits kernels.attention's `impl` (the composition's: SDPA takes neither)."""

    def __init__(self, window_left: int = -1, sink_heads: int = 0, impl: str = "flash", device=None):
        super().__init__()
        self.window_left, self.impl = window_left, impl
        self.sinks = nn.Parameter(torch.empty(sink_heads, device=device, dtype=torch.float32),
                                  requires_grad=False) if sink_heads else None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        t, kv_len = q.shape[2], k.shape[2]
        if self.window_left >= 0 or self.sinks is not None:
            if q.device.type == "meta":  # tracing shapes: nothing runs
                return torch.empty_like(q)
            return kernel_attention(q, k, v, impl=self.impl, causal=True, window_left=self.window_left,
                                    sinks=self.sinks)
        mask = None
        if causal and 1 < t < kv_len:  # SDPA's is_causal is top-left aligned: right only when q and kv start together
            mask = lower_right(t, kv_len, q.device)
        is_causal = causal and mask is None and t > 1
        if sdpa_has_gqa():
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=True)
        # torch < 2.5: no enable_gqa, so expand the KV heads to the query heads (a copy of the cache slice)
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal)


class Absorb(nn.Module):
    """One of MLA's absorbed projections, a batched matmul over heads (x [H, N, K] @ w [H, K, N']), a module so a
    forward hook sees it."""

    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.bmm(x, w)


class LatentAttention(nn.Module):
    """kernels.mla_decode's `impl` over the latent cache, a module of its own for the forward hook; on the meta
    device (tracing shapes) nothing runs."""

    def __init__(self, impl: str, scale: float, v_dim: int):
        super().__init__()
        self.impl, self.scale, self.v_dim = impl, scale, v_dim

    def forward(self, q: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        if q.device.type == "meta":
            return q.new_empty(*q.shape[:3], self.v_dim)
        return mla_decode(q, latent, impl=self.impl, scale=self.scale, v_dim=self.v_dim)


class MLAAttention(nn.Module):
    """DeepSeek's multi-head latent attention on normed hidden states: q_kv_a (the query, or its q_lora down
    projection and q_b, fused with the latent's down projection), the latent normed and cached with its rotary key
    (one [kv_lora_rank + qk_rope_head_dim] row per token), then a decode call (at most MLA_ABSORBED_MAX tokens after
    a cached prefix) absorbed: kv_b's key half into the queries, kernels.mla_decode over the latent, its value half
    out of the result; a prompt or chunk decompressed: kv_b over every cached latent to each head's key and value,
    attention over H heads of qk dims (the value padded to them, as the composed attention row); then o."""

    def __init__(self, config: DecoderConfig, max_batch: int, max_tokens: int, device, dtype, impl: str = "torch"):
        super().__init__()
        c = self.config = config
        h, qk = c.q_heads, c.qk_head_dim
        self.q_kv_a = bare_linear(c.hidden, (c.q_lora_rank or h * qk) + c.latent_dim, device, dtype)
        if c.q_lora_rank:
            self.q_norm = RMSNorm(c.q_lora_rank, device, dtype)
            self.q_b = bare_linear(c.q_lora_rank, h * qk, device, dtype)
        self.kv_norm = RMSNorm(c.kv_lora_rank, device, dtype)
        self.kv_b = bare_linear(c.kv_lora_rank, h * (c.qk_nope_head_dim + c.head_dim), device, dtype)
        self.o = bare_linear(h * c.head_dim, c.hidden, device, dtype)
        self.q_absorb, self.v_up = Absorb(), Absorb()
        self.latent_attention = LatentAttention(impl, c.softmax_scale, c.kv_lora_rank)
        self.attention = Attention()
        self.register_buffer("latent_cache", torch.empty(max_batch, max_tokens, c.latent_dim, device=device,
                                                         dtype=dtype))
        self._absorbed: tuple[int, torch.Tensor, torch.Tensor] | None = None

    def absorbed_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """kv_b's halves per head, made contiguous once per weight version (as vLLM does after loading): the key half
        [H, qk_nope, kv_lora] for the queries, the value half [H, kv_lora, v] for the output; a packed kv_b (a
        served format) dequantized to the activation dtype once, as vLLM absorbs it."""
        weight = getattr(self.kv_b, "weight", None)
        version = -1 if weight is None else weight._version  # a packed weight never changes
        if self._absorbed is None or self._absorbed[0] != version:
            if weight is None:
                weight = self.kv_b.qweight.dequantize(self.latent_cache.dtype)
            c = self.config
            per_head = weight.view(c.q_heads, c.qk_nope_head_dim + c.head_dim, c.kv_lora_rank)
            self._absorbed = (version, per_head[:, :c.qk_nope_head_dim].contiguous(),
                              per_head[:, c.qk_nope_head_dim:].transpose(1, 2).contiguous())
        return self._absorbed[1], self._absorbed[2]

    def forward(self, x: torch.Tensor, start: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        c = self.config
        b, t, _ = x.shape
        h, nope, rope, lora = c.q_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.kv_lora_rank
        q, latent, k_rope = self.q_kv_a(x).split((c.q_lora_rank or h * c.qk_head_dim, lora, rope), dim=-1)
        if c.q_lora_rank:
            q = self.q_b(self.q_norm(q))
        q_nope, q_rope = q.view(b, t, h, nope + rope).transpose(1, 2).split((nope, rope), dim=-1)
        cos, sin = cos[start:start + t], sin[start:start + t]
        end = start + t
        self.latent_cache[:b, start:end, :lora] = self.kv_norm(latent)
        self.latent_cache[:b, start:end, lora:] = rotary(k_rope, cos, sin)
        q_rope = rotary(q_rope, cos, sin)
        if t <= MLA_ABSORBED_MAX and start > 0:
            w_uk, w_uv = self.absorbed_weights()
            q_latent = self.q_absorb(q_nope.permute(1, 0, 2, 3).reshape(h, b * t, nope), w_uk)
            q_latent = q_latent.view(h, b, t, lora).transpose(0, 1)
            out = self.latent_attention(torch.cat((q_latent, q_rope), dim=-1), self.latent_cache[:b, None, :end])
            out = self.v_up(out.permute(1, 0, 2, 3).reshape(h, b * t, lora), w_uv)  # [H, b*t, v]
            out = out.view(h, b, t, c.head_dim).permute(1, 2, 0, 3)
        else:
            kv = self.kv_b(self.latent_cache[:b, :end, :lora]).view(b, end, h, nope + c.head_dim).transpose(1, 2)
            k_nope, v = kv.split((nope, c.head_dim), dim=-1)
            k = torch.cat((k_nope, self.latent_cache[:b, None, :end, lora:].expand(b, h, end, rope)), dim=-1)
            v = F.pad(v, (0, c.qk_head_dim - c.head_dim))
            out = self.attention(torch.cat((q_nope, q_rope), dim=-1), k, v, t > 1)[..., :c.head_dim].transpose(1, 2)
        return self.o(out.reshape(b, t, h * c.head_dim))


def unserved(config: DecoderConfig, impls: dict[str, str], device, dtype: torch.dtype) -> str:
    """Why the composition's impls cannot serve `config`'s attention on `device` (one line, naming the op and impl),
    "" where they can: each kind probed with a call of two tokens (a window layer's, a full layer's with sinks, MLA's
    decode and its decompressed prompt)."""
    device = torch.device(device)

    def zeros(*shape):
        return torch.zeros(*shape, device=device, dtype=dtype)

    probes = []
    if config.attention == "mla":  # its prompts' attention is plain causal, which every impl serves
        latent = config.latent_dim
        probes.append(("mla", lambda: prepare_mla(zeros(1, config.q_heads, 1, latent), zeros(1, 1, 2, latent),
                                                  impl=impls["mla"], scale=config.softmax_scale,
                                                  v_dim=config.kv_lora_rank)))
    sinks = torch.zeros(config.q_heads, device=device) if config.sinks else None
    windows = {-1 if kind == "full" else config.window_left for _, kind in config.layer_groups()}
    h, hkv, d = config.q_heads, config.kv_heads, config.head_dim
    for window in sorted(w for w in windows if w >= 0 or sinks is not None) if config.attention != "mla" else ():
        for sq in (1, 2):
            probes.append(("attention", lambda w=window, sq=sq: prepare(
                zeros(1, h, sq, d), zeros(1, hkv, 2, d), zeros(1, hkv, 2, d), impl=impls["attention"], causal=True,
                window_left=w, sinks=sinks)))
    for op, probe in probes:
        try:
            probe()
        except (Unsupported, ValueError) as err:
            what = "MLA decode" if op == "mla" else "sliding-window layers" if config.attention == "window" else \
                "attention"
            what += " with sinks" if config.sinks and op == "attention" else ""
            return (f"{op}={impls[op]} cannot serve {config.name}'s {what} on {device.type} "
                    f"({str(err).splitlines()[0]}); choose another with --impl {op}=...")
    return ""
