"""The eager torch implementation of the elementwise kinds, as a plain PyTorch decoder (Hugging Face Llama style)
runs them: fp32 inside rmsnorm and the RoPE angles."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..registry import Impl, PlannedCall, add_builtin, dtype_name
from .request import ElementwiseRequest


def _rmsnorm(x, weight, *, eps):
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _residual_add(x, residual):
    return x + residual


def _add_rmsnorm(x, residual, weight, *, eps):
    """The residual add then the next norm, as a decoder layer chains them: (the normed sum, the sum)."""
    h = x + residual
    return _rmsnorm(h, weight, eps=eps), h


def _silu_mul(gate_up):
    half = gate_up.shape[1] // 2
    return F.silu(gate_up[:, :half]) * gate_up[:, half:]


def rotary_inv_freq(head_dim: int, base: float, device) -> torch.Tensor:
    """base ** (-2i / D) for i < D/2, rounded once from float64 to float32 (a model's constant, made at load)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    return torch.pow(base, -exponents).to(device=device, dtype=torch.float32)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotary(q, k, positions, *, inv_freq):
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # fp32 angles, [M, D/2]
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos().to(q.dtype)[:, None, :], emb.sin().to(q.dtype)[:, None, :]
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _kv_append(cache_k, cache_v, k, v, positions):
    cache_k.index_copy_(0, positions, k)
    cache_v.index_copy_(0, positions, v)
    return cache_k, cache_v


def _greedy_pick(logits):
    return torch.argmax(logits, dim=-1)


EAGER = {"rmsnorm": _rmsnorm, "residual_add": _residual_add, "silu_mul": _silu_mul, "rotary": _rotary,
         "kv_append": _kv_append, "greedy_pick": _greedy_pick, "add_rmsnorm": _add_rmsnorm}
BACKEND = "torch-eager"


def _plan(req: ElementwiseRequest) -> PlannedCall:
    fn, tensors, options = EAGER[req.kind], req.tensors, dict(req.options)
    if req.kind == "rotary":  # the frequencies are made once, as a model holds them in a buffer
        options = {"inv_freq": rotary_inv_freq(tensors[0].shape[2], options["base"], tensors[0].device)}
    return PlannedCall("torch", BACKEND, lambda: fn(*tensors, **options))


TORCH_ELEMENTWISE = add_builtin(Impl(
    name="torch",
    summary="eager torch ops, as a plain PyTorch decoder runs them (fp32 inside rmsnorm and the RoPE angles)",
    devices=frozenset({"cpu", "cuda"}),
    dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32}),
    plan=_plan,
    backends=lambda device_type: BACKEND,
    op="elementwise",
    # torch's elementwise kernels compute half inputs in fp32 (their opmath type) and round the result once
    compute=lambda device_type, dtype, fields: dtype_name(torch.promote_types(dtype, torch.float32)),
))
