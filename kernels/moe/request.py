"""Validation of a routed-experts call (x [M, K], experts w_gate_up [E, 2N, K] and w_down [E, K, N], float or packed
stacks of one scheme, a token's top-k experts and their weights) and of the router's top-k, each into one request."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..qlinear.request import check_qweight
from ..qlinear.schemes import QuantizedWeight
from ..registry import add_operator

MOE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
ROUTER_SCORINGS = ("softmax", "sigmoid")  # bench/spec/models.py's too (the spec is torch-free)
REQUEST_DTYPES = (*MOE_DTYPES, torch.float64)  # float64: the naive impl's, for references


@dataclass(frozen=True)
class MoeRequest:
    """A validated call: x [M, K], w_gate_up [E, 2N, K] (the gate's N rows, then the up projection's), w_down
    [E, K, N] (float tensors, or QuantizedWeight stacks of one scheme), topk_weights float32 [M, top_k], topk_ids
    int32 [M, top_k]; output [M, K] in x's dtype."""

    x: torch.Tensor
    w_gate_up: torch.Tensor | QuantizedWeight
    w_down: torch.Tensor | QuantizedWeight
    topk_weights: torch.Tensor
    topk_ids: torch.Tensor

    @property
    def m(self) -> int:
        return self.x.shape[0]

    @property
    def k(self) -> int:
        """The hidden size (x's columns, the output's)."""
        return self.x.shape[1]

    @property
    def n(self) -> int:
        """Each expert's intermediate size."""
        return self.w_down.shape[2]

    @property
    def experts(self) -> int:
        return self.w_gate_up.shape[0]

    @property
    def top_k(self) -> int:
        return self.topk_ids.shape[1]

    @property
    def slots(self) -> int:
        """(token, expert) pairs: M x top_k."""
        return self.m * self.top_k

    @property
    def scheme(self) -> str:
        """The experts' packing (qlinear's schemes), "" for float weights."""
        return self.w_gate_up.scheme if isinstance(self.w_gate_up, QuantizedWeight) else ""

    def expert_weights(self, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Expert `expert`'s (gate_up [2N, K], down [K, N]) in x's dtype: views of float stacks, packed ones
        dequantized (that expert only)."""
        if not self.scheme:
            return self.w_gate_up[expert], self.w_down[expert]
        return tuple(w.expert(expert).dequantize(self.dtype) for w in (self.w_gate_up, self.w_down))

    @property
    def device_type(self) -> str:
        return self.x.device.type

    @property
    def dtype(self) -> torch.dtype:
        return self.x.dtype


def _tensor(name: str, t, rank: int, layout: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != rank or 0 in t.shape:
        raise ValueError(f"{name}: must be a non-empty {layout}, got shape {tuple(t.shape)}")


def validate_moe(x, w_gate_up, w_down, topk_weights, topk_ids) -> MoeRequest:
    """Check the arguments of `moe` and return the request, or raise a one-line ValueError. The ids are read back
    to check their range (a device sync): validation happens when a call is planned, never inside a timed call."""
    _tensor("x", x, 2, "[M, K] matrix")
    if x.dtype not in REQUEST_DTYPES:
        raise ValueError(f"x: must be float16, bfloat16, float32 or float64, got {x.dtype}")
    if x.stride(-1) != 1:
        raise ValueError(f"x: its last dimension must be contiguous (stride 1), got strides {x.stride()}")
    m, k = x.shape
    packed = _check_stacks(w_gate_up, w_down)
    experts, n = w_down.shape[0], w_down.shape[2]
    for name, w, shape in (("w_gate_up", w_gate_up, (experts, 2 * n, k)), ("w_down", w_down, (experts, k, n))):
        if packed:
            if w.device != x.device:
                raise ValueError(f"{name}: device must match x ({x.device}), got {w.device}")
            if tuple(w.shape) != shape:
                raise ValueError(f"{name}: must be {list(shape)} for x [{m}, {k}] and w_down {list(w_down.shape)}, "
                                 f"got {list(w.shape)}")
            continue
        if w.dtype != x.dtype:
            raise ValueError(f"{name}: dtype must match x ({x.dtype}), got {w.dtype}")
        if w.device != x.device:
            raise ValueError(f"{name}: device must match x ({x.device}), got {w.device}")
        if tuple(w.shape) != shape:
            raise ValueError(f"{name}: must be {list(shape)} for x [{m}, {k}] and w_down {list(w_down.shape)}, "
                             f"got {list(w.shape)}")
        if not w.is_contiguous():
            raise ValueError(f"{name}: must be contiguous")
    _tensor("topk_ids", topk_ids, 2, "[M, top_k] matrix")
    _tensor("topk_weights", topk_weights, 2, "[M, top_k] matrix")
    if topk_ids.dtype != torch.int32:
        raise ValueError(f"topk_ids: must be int32, got {topk_ids.dtype}")
    if topk_weights.dtype != torch.float32:
        raise ValueError(f"topk_weights: must be float32, got {topk_weights.dtype}")
    for name, t in (("topk_ids", topk_ids), ("topk_weights", topk_weights)):
        if t.shape[0] != m:
            raise ValueError(f"{name}: must have M = {m} rows (x's), got shape {tuple(t.shape)}")
        if t.device != x.device:
            raise ValueError(f"{name}: device must match x ({x.device}), got {t.device}")
        if not t.is_contiguous():
            raise ValueError(f"{name}: must be contiguous")
    if topk_weights.shape != topk_ids.shape:
        raise ValueError(f"topk_weights: shape must match topk_ids {tuple(topk_ids.shape)}, got "
                         f"{tuple(topk_weights.shape)}")
    if topk_ids.shape[1] > experts:
        raise ValueError(f"topk_ids: top_k ({topk_ids.shape[1]}) must be at most the {experts} experts")
    low, high = int(topk_ids.min()), int(topk_ids.max())
    if low < 0 or high >= experts:
        raise ValueError(f"topk_ids: ids must be in 0..{experts - 1}, got {low if low < 0 else high}")
    return MoeRequest(x, w_gate_up, w_down, topk_weights, topk_ids)


def _check_stacks(w_gate_up, w_down) -> bool:
    """Both float stacks (False) or both QuantizedWeight stacks of one scheme with their layouts (True)."""
    if not isinstance(w_gate_up, QuantizedWeight) and not isinstance(w_down, QuantizedWeight):
        _tensor("w_gate_up", w_gate_up, 3, "[E, 2N, K] tensor")
        _tensor("w_down", w_down, 3, "[E, K, N] tensor")
        return False
    for name, w in (("w_gate_up", w_gate_up), ("w_down", w_down)):
        if not isinstance(w, QuantizedWeight):
            raise ValueError(f"{name}: must be a QuantizedWeight stack as the other expert stack is, "
                             f"got {type(w).__name__}")
        try:
            check_qweight(w, experts=True)
        except ValueError as err:
            raise ValueError(f"{name}: {str(err).removeprefix('qweight: ')}") from None
    if w_down.scheme != w_gate_up.scheme:
        raise ValueError(f"w_down: must be packed as w_gate_up is ({w_gate_up.scheme}), got {w_down.scheme}")
    return True


def validate_route(router_logits, top_k, scoring="softmax", scale=1.0) -> None:
    """Check the arguments of `route`, or raise a one-line ValueError."""
    _tensor("router_logits", router_logits, 2, "[M, E] matrix")
    if not router_logits.is_floating_point():
        raise ValueError(f"router_logits: must be a floating dtype, got {router_logits.dtype}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= router_logits.shape[1]:
        raise ValueError(f"top_k: must be an int in 1..{router_logits.shape[1]} (the experts), got {top_k!r}")
    if scoring not in ROUTER_SCORINGS:
        raise ValueError(f"scoring: must be one of {', '.join(ROUTER_SCORINGS)}, got {scoring!r}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale < float("inf"):
        raise ValueError(f"scale: must be a positive finite number, got {scale!r}")


def route(router_logits: torch.Tensor, top_k: int, *, renormalize: bool = False, scoring: str = "softmax",
          scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The router's choice per token, in fp32: each expert's score (`scoring`: a softmax over the experts, or a
    sigmoid of each logit, DeepSeek-V3's), the k best (topk_ids int32 [M, k]) and their scores (topk_weights float32
    [M, k]); with `renormalize` a token's k weights are divided by their sum (Mixtral, Qwen3-MoE, gpt-oss,
    DeepSeek-V3), then multiplied by `scale` (DeepSeek's routed_scaling_factor). The defaults are a plain softmax's
    top k."""
    validate_route(router_logits, top_k, scoring, scale)
    logits = router_logits.float()
    scores = torch.softmax(logits, dim=-1) if scoring == "softmax" else torch.sigmoid(logits)
    weights, ids = torch.topk(scores, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    if scale != 1:
        weights = weights * scale
    return weights.contiguous(), ids.to(torch.int32).contiguous()


def call_plugin(fn, req: MoeRequest):
    """A user's routed-experts function, called with the operator's convention."""
    return fn(req.x, req.w_gate_up, req.w_down, req.topk_weights, req.topk_ids)


add_operator("moe", call_plugin)
