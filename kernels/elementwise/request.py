"""Validation of an elementwise call (norms, adds, activations, RoPE, KV append, greedy pick) into one request."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..registry import add_operator

KINDS = ("rmsnorm", "residual_add", "silu_mul", "rotary", "kv_append", "greedy_pick", "add_rmsnorm")
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Each kind's tensor arguments (name, rank); the first one sets the dtype and device of the call.
SIGNATURES = {
    "rmsnorm": (("x", 2), ("weight", 1)),
    "residual_add": (("x", 2), ("residual", 2)),
    "silu_mul": (("gate_up", 2),),
    "rotary": (("q", 3), ("k", 3), ("positions", 1)),
    "kv_append": (("cache_k", 3), ("cache_v", 3), ("k", 3), ("v", 3), ("positions", 1)),
    "greedy_pick": (("logits", 2),),
    "add_rmsnorm": (("x", 2), ("residual", 2), ("weight", 1)),
}
SHAPES = {"x": "[M, H]", "weight": "[H]", "residual": "[M, H]", "gate_up": "[M, 2I]", "q": "[M, Hq, D]",
          "k": "[M, Hkv, D]", "v": "[M, Hkv, D]", "positions": "[M]", "cache_k": "[S, Hkv, D]",
          "cache_v": "[S, Hkv, D]", "logits": "[M, V]"}
# keyword options and their defaults
OPTIONS = {"rmsnorm": {"eps": 1e-6}, "rotary": {"base": 500000.0}, "add_rmsnorm": {"eps": 1e-6}}



@dataclass(frozen=True)
class ElementwiseRequest:
    """A validated call: the kind, its tensors in the kind's order, and its options with defaults filled."""

    kind: str
    tensors: tuple
    options: dict = field(default_factory=dict)

    @property
    def device_type(self) -> str:
        return self.tensors[0].device.type

    @property
    def dtype(self) -> torch.dtype:
        return self.tensors[0].dtype


def _check_tensor(name: str, rank: int, t, first) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != rank:
        raise ValueError(f"{name}: must have rank {rank} ({SHAPES[name]}), got shape {tuple(t.shape)}")
    if 0 in t.shape:
        raise ValueError(f"{name}: must not have an empty dimension, got shape {tuple(t.shape)}")
    if t.stride(-1) != 1:
        raise ValueError(f"{name}: its last dimension must be contiguous (stride 1), got strides {t.stride()}")
    if name == "positions":
        if t.dtype != torch.int64:
            raise ValueError(f"positions: must be int64, got {t.dtype}")
    elif first is None and t.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name}: must be a floating dtype (float16/bfloat16/float32/float64), got {t.dtype}")
    elif first is not None and t.dtype != first[1].dtype:
        raise ValueError(f"{name}: dtype must match {first[0]} ({first[1].dtype}), got {t.dtype}")
    if first is not None and t.device != first[1].device:
        raise ValueError(f"{name}: device must match {first[0]} ({first[1].device}), got {t.device}")


def _shape_rules(kind: str, t: dict) -> str | None:
    """The first broken rule between the arguments of `kind`, as a one-line message; None when they agree."""
    if kind in ("rmsnorm", "add_rmsnorm") and t["weight"].shape[0] != t["x"].shape[1]:
        return f"weight: must be [H] with H = x's {t['x'].shape[1]}, got shape {tuple(t['weight'].shape)}"
    if kind in ("residual_add", "add_rmsnorm") and t["residual"].shape != t["x"].shape:
        return f"residual: must have x's shape {tuple(t['x'].shape)}, got {tuple(t['residual'].shape)}"
    if kind == "silu_mul" and t["gate_up"].shape[1] % 2:
        return f"gate_up: its last dimension must be even (gate and up halves), got {t['gate_up'].shape[1]}"
    if kind == "rotary":
        q, k = t["q"], t["k"]
        if k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
            return f"k: must be [M, Hkv, D] with q's M {q.shape[0]} and D {q.shape[2]}, got shape {tuple(k.shape)}"
        if q.shape[2] % 2:
            return f"q: head dim must be even (rotate-half), got {q.shape[2]}"
    if kind == "kv_append":
        cache, k = t["cache_k"], t["k"]
        if t["cache_v"].shape != cache.shape:
            return f"cache_v: must have cache_k's shape {tuple(cache.shape)}, got {tuple(t['cache_v'].shape)}"
        if k.shape[1:] != cache.shape[1:] or t["v"].shape != k.shape:
            return (f"k, v: must be [M, Hkv, D] with the cache's Hkv, D {tuple(cache.shape[1:])}, got "
                    f"{tuple(k.shape)} and {tuple(t['v'].shape)}")
        if k.shape[0] > cache.shape[0]:
            return f"k: {k.shape[0]} rows do not fit a cache of {cache.shape[0]} rows"
    if "positions" in t:
        m, pos = t["q" if kind == "rotary" else "k"].shape[0], t["positions"]
        if pos.shape[0] != m:
            return f"positions: must be [M] with M = {m}, got shape {tuple(pos.shape)}"
        rows = t["cache_k"].shape[0] if kind == "kv_append" else 1 << 24  # fp32 angles are exact below 2**24
        if pos.min().item() < 0 or pos.max().item() >= rows:
            return f"positions: must lie in [0, {rows}), got {pos.min().item()}..{pos.max().item()}"
    return None


def validate_elementwise(kind, *tensors, **options) -> ElementwiseRequest:
    """Check the arguments of `elementwise` and return the request, or raise a one-line ValueError."""
    if kind not in KINDS:
        raise ValueError(f"kind: unknown elementwise kind {kind!r}, choose from {', '.join(KINDS)}")
    signature = SIGNATURES[kind]
    names = ", ".join(name for name, _ in signature)
    if len(tensors) != len(signature):
        raise ValueError(f"{kind}: takes {len(signature)} tensors ({names}), got {len(tensors)}")
    first = None
    for (name, rank), t in zip(signature, tensors, strict=True):
        _check_tensor(name, rank, t, first)
        first = first or (name, t)
    allowed = OPTIONS.get(kind, {})
    for key, value in options.items():
        if key not in allowed:
            takes = f"takes {', '.join(allowed)}" if allowed else "takes none"
            raise ValueError(f"{kind}: unknown option {key!r} ({takes})")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{key}: must be a positive finite number, got {value!r}")
    reason = _shape_rules(kind, {name: t for (name, _), t in zip(signature, tensors, strict=True)})
    if reason:
        raise ValueError(reason)
    return ElementwiseRequest(kind, tuple(tensors), {**allowed, **{k: float(v) for k, v in options.items()}})


def call_plugin(fn, req: ElementwiseRequest):
    """A user's elementwise function, called with the operator's convention (options filled: eps, base)."""
    return fn(req.kind, *req.tensors, **req.options)


add_operator("elementwise", call_plugin)
