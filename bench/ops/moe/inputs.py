"""The seeded inputs of a routed-experts case: activations, the experts' weights (outputs of order one; packed as
one stack per projection where the case names a scheme), and the routing: the case's drawn experts per token
(bench.spec.routing) turned into router logits that `route` picks them from, so the weights are a real softmax's."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ....kernels import QuantizedWeight, quantize, route
from ...instruments.roofline import TORCH_DTYPES
from ...spec.routing import draw_routing
from .cases import MoeCase, expert_weights

CHOSEN_LOGITS = (2.0, 3.0)  # the drawn experts' logits lie in [2, 3), every other's in [-1, 1): top-k is exact


@dataclass(frozen=True, eq=False)
class ExpertWeights:
    """Every expert's weights: w_gate_up [E, 2N, K] (gate rows first) and w_down [E, K, N], float tensors or packed
    stacks. `nbytes` counts the experts a call reads (`touched`), which is what the cold-operand rotation must push
    out of the cache."""

    w_gate_up: torch.Tensor | QuantizedWeight
    w_down: torch.Tensor | QuantizedWeight
    touched: int

    @property
    def nbytes(self) -> int:
        per_expert = (self.w_gate_up.nbytes + self.w_down.nbytes) // self.w_gate_up.shape[0]  # nvfp4: exact too
        return per_expert * self.touched

    @property
    def clone_nbytes(self) -> int:
        """What a clone allocates: every expert, touched or not (the memory a cold rotation is charged)."""
        return self.w_gate_up.nbytes + self.w_down.nbytes

    def clone(self) -> ExpertWeights:
        """A copy with its own storage (a cold copy of the streamed weights)."""
        return ExpertWeights(self.w_gate_up.clone(), self.w_down.clone(), self.touched)


@dataclass(frozen=True)
class MoeInputs:
    x: torch.Tensor
    experts: ExpertWeights
    topk_weights: torch.Tensor
    topk_ids: torch.Tensor

    @property
    def w_gate_up(self) -> torch.Tensor | QuantizedWeight:
        return self.experts.w_gate_up

    @property
    def w_down(self) -> torch.Tensor | QuantizedWeight:
        return self.experts.w_down


def router_logits(case: MoeCase, device: torch.device, gen: torch.Generator) -> torch.Tensor:
    """[M, E] float32 logits whose top k per token are exactly the case's drawn experts."""
    ids = torch.from_numpy(draw_routing(case.m, case.experts, case.top_k, case.routing, case.routing_seed).copy())
    logits = torch.rand((case.m, case.experts), generator=gen, device=device).mul_(2).sub_(1)
    low, high = CHOSEN_LOGITS
    chosen = torch.rand((case.m, case.top_k), generator=gen, device=device).mul_(high - low).add_(low)
    return logits.scatter_(1, ids.to(device=device, dtype=torch.int64), chosen)


def make_inputs(case: MoeCase, device: torch.device, seed: int = 0) -> MoeInputs:
    """Standard-normal activations; standard-normal expert weights scaled by K**-0.5 (gate, up) and N**-0.5 (down),
    drawn in fp32 and rounded to the case's dtype, then packed by its scheme (the same draws as the float case);
    routing weights from `route` (softmax, top k, not renormalized)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = TORCH_DTYPES[case.dtype]
    x = torch.randn((case.m, case.k), generator=gen, device=device, dtype=dtype)
    shapes = ((2 * case.n, case.k), (case.k, case.n))
    if case.scheme:
        packed = ([], [])
        for _ in range(case.experts):  # one expert at a time: the fp32 draw never holds a whole layer
            for stack, shape in zip(packed, shapes, strict=True):
                w = torch.randn(shape, generator=gen, device=device).mul_(shape[1] ** -0.5).to(dtype)
                stack.append(quantize(w, case.scheme))
        w_gate_up, w_down = (stacked(stack) for stack in packed)
    else:
        w_gate_up, w_down = (torch.empty((case.experts, *shape), device=device, dtype=dtype) for shape in shapes)
        for e in range(case.experts):
            for stack, shape in zip((w_gate_up, w_down), shapes, strict=True):
                stack[e] = torch.randn(shape, generator=gen, device=device).mul_(shape[1] ** -0.5)
    topk_weights, topk_ids = route(router_logits(case, device, gen), case.top_k)
    return MoeInputs(x, ExpertWeights(w_gate_up, w_down, case.touched_experts), topk_weights, topk_ids)


def stacked(matrices: list[QuantizedWeight]) -> QuantizedWeight:
    """Packed matrices as one stack, each of its tensors with a leading E (the layout `quantize` gives a stack),
    each expert's tensors freed as they are copied in."""
    first = matrices[0]
    names = [name for name in ("qdata", "scales", "zeros", "tensor_scale") if getattr(first, name) is not None]
    out = {name: torch.empty((len(matrices), *getattr(first, name).shape), dtype=getattr(first, name).dtype,
                             device=first.device) for name in names}
    for e, matrix in enumerate(matrices):
        for name in names:
            out[name][e] = getattr(matrix, name)
        matrices[e] = None
    return QuantizedWeight(out["qdata"], out["scales"], out.get("zeros"), first.scheme, (len(matrices), *first.shape),
                           out.get("tensor_scale"))


def weight_bytes(case: MoeCase) -> float:
    """Every expert's weights: what the inputs hold, whatever the call touches."""
    return expert_weights(case, case.experts)
