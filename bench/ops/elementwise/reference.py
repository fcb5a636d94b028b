"""The float64 reference of an elementwise case, on every device (in fp32 on a GPU it was the eager code under test);
tuple and index outputs reach the gate through a view of them (gate.Viewed), outside the timing."""

from __future__ import annotations

import torch

from ....kernels.elementwise.request import OPTIONS
from ...instruments.gate import Viewed
from .cases import ElementwiseCase
from .inputs import ElementwiseInputs

EPS = OPTIONS["rmsnorm"]["eps"]
BASE = OPTIONS["rotary"]["base"]


def rotary_frequencies(head_dim: int, device: torch.device) -> torch.Tensor:
    """base ** (-2i / D) in float64, rounded once to float32: the convention's frequencies, as a model holds them."""
    freq = 1.0 / torch.pow(BASE, torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    return freq.to(device=device, dtype=torch.float32)


def rotary_angles(case: ElementwiseCase, positions: torch.Tensor) -> torch.Tensor:
    """fp32 positions times the fp32 frequencies, one fp32 rounding: [M, D/2]."""
    return positions.to(torch.float32)[:, None] * rotary_frequencies(case.head_dim, positions.device)[None, :]


def rotate(x, cos, sin):
    """Rotate-half RoPE written out on the two halves of the last dimension, in x's dtype."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def reference_dtype(device: torch.device) -> torch.dtype:
    return torch.float64


def _what(out) -> str:
    return type(out).__name__ if not isinstance(out, torch.Tensor) else f"a {out.dtype} tensor {tuple(out.shape)}"


def _pair(out, names: tuple[str, str], likes: tuple) -> None:
    """Raise a one-line ValueError unless `out` is two tensors shaped and typed like `likes`."""
    if not isinstance(out, (tuple, list)) or len(out) != 2 or not all(isinstance(t, torch.Tensor) for t in out):
        raise ValueError(f"output must be a pair of tensors ({', '.join(names)}), got {_what(out)}")
    for name, t, like in zip(names, out, likes, strict=True):
        if t.shape != like.shape or t.dtype != like.dtype:
            raise ValueError(f"output {name} is {_what(t)}, expected a {like.dtype} tensor {tuple(like.shape)}")


def _rotary_view(q, k):
    def view(out):
        _pair(out, ("q", "k"), (q, k))
        return torch.cat((out[0].flatten(), out[1].flatten()))
    return view


def _sum_view(x):
    def view(out):
        _pair(out, ("normed", "sum"), (x, x))
        return torch.cat((out[0].flatten(), out[1].flatten()))
    return view


def _kv_view(cache_k, cache_v, positions):
    def view(out):
        _pair(out, ("cache_k", "cache_v"), (cache_k, cache_v))
        if out[0].data_ptr() != cache_k.data_ptr() or out[1].data_ptr() != cache_v.data_ptr():
            raise ValueError("kv_append must write the caches in place and return them")
        return torch.cat((out[0].index_select(0, positions).flatten(), out[1].index_select(0, positions).flatten()))
    return view


def _pick_view(logits):
    def view(out):
        m, vocab = logits.shape
        if not isinstance(out, torch.Tensor) or out.dtype != torch.int64 or tuple(out.shape) != (m,):
            raise ValueError(f"output must be int64 token ids [{m}], got {_what(out)}")
        if out.min().item() < 0 or out.max().item() >= vocab:
            raise ValueError(f"output token ids must lie in [0, {vocab}), got {out.min().item()}..{out.max().item()}")
        return logits.gather(1, out[:, None]).squeeze(1)  # a right pick has the row's largest logit; ties are fine
    return view


def reference(case: ElementwiseCase, inputs: ElementwiseInputs, device: torch.device):
    """The kind's math in float64; a gate.Viewed for tuple and index outputs."""
    r = reference_dtype(device)
    t = inputs.tensors
    if case.kind == "rmsnorm":
        x, w = t[0].to(r), t[1].to(r)
        return x / torch.sqrt((x * x).sum(dim=1, keepdim=True) / case.n + EPS) * w
    if case.kind == "residual_add":
        return t[0].to(r) + t[1].to(r)
    if case.kind == "add_rmsnorm":
        h, w = t[0].to(r) + t[1].to(r), t[2].to(r)
        normed = h / torch.sqrt((h * h).sum(dim=1, keepdim=True) / case.n + EPS) * w
        return Viewed(torch.cat((normed.flatten(), h.flatten())), _sum_view(t[0]))
    if case.kind == "silu_mul":
        gate, up = t[0][:, :case.n].to(r), t[0][:, case.n:].to(r)
        return gate / (1 + torch.exp(-gate)) * up
    if case.kind == "rotary":
        angles = rotary_angles(case, t[2]).to(r)
        cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
        rotated = (rotate(t[0].to(r), cos, sin), rotate(t[1].to(r), cos, sin))
        return Viewed(torch.cat([x.flatten() for x in rotated]), _rotary_view(t[0], t[1]))
    if case.kind == "kv_append":
        return Viewed(torch.cat((t[2].flatten(), t[3].flatten())).to(r), _kv_view(t[0], t[1], t[4]))
    return Viewed(t[0].amax(dim=1).to(r), _pick_view(t[0]))  # a max is exact in any dtype


