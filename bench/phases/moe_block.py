"""The mixture-of-experts MLP of phasebench's reference decoder: a router (hidden -> experts) routing as the model's
config says, the routed experts through kernels.moe (the composition's moe impl), shared experts where it has them."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...kernels import MoeRequest, get_impl, quantize, route
from ..ops.moe.inputs import stacked
from ..spec.models import DecoderConfig


class MoeBlock(nn.Module):
    """Routed experts w_gate_up [E, 2N, K] (gate rows first) and w_down [E, K, N], N = config.intermediate; `router`,
    and `gate_up` / `down` for the shared experts, are nn.Linear layers the decoder's weight fill and its op hooks
    see as any projection."""

    def __init__(self, config: DecoderConfig, device, dtype, impl: str = "torch"):
        super().__init__()
        c = config
        self.top_k, self.impl = c.top_k, impl
        self.routing = dict(scoring=c.router_scoring, renormalize=c.router_renormalize, scale=c.router_scale)
        self.router = bare_linear(c.hidden, c.experts, device, dtype)
        self.w_gate_up = nn.Parameter(torch.empty(c.experts, 2 * c.intermediate, c.hidden, device=device,
                                                  dtype=dtype), requires_grad=False)
        self.w_down = nn.Parameter(torch.empty(c.experts, c.hidden, c.intermediate, device=device, dtype=dtype),
                                   requires_grad=False)
        self.shared = bool(c.shared_intermediate)
        if self.shared:
            self.gate_up = bare_linear(c.hidden, 2 * c.shared_intermediate, device, dtype)
            self.down = bare_linear(c.shared_intermediate, c.hidden, device, dtype)
        self.experts = Experts(impl)

    def fill(self, fill_random, gen) -> None:
        """The routed experts' weights, drawn as the decoder draws a projection's (std = fan-in ** -0.5)."""
        fill_random(self.w_gate_up, self.w_gate_up.shape[-1] ** -0.5, gen)
        fill_random(self.w_down, self.w_down.shape[-1] ** -0.5, gen)

    def pack(self, scheme: str) -> None:
        """The routed experts packed by `scheme` (expert stacks: kernels.quantize), as a served checkpoint holds
        them; the float copies are dropped."""
        # one expert at a time: quantizing a whole stack at once takes several times its size in temporaries
        gate_up, down = (stacked([quantize(w[e], scheme) for e in range(w.shape[0])])
                         for w in (self.w_gate_up.data, self.w_down.data))
        del self.w_gate_up, self.w_down
        self.w_gate_up, self.w_down = gate_up, down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, ids = route(self.router(flat), self.top_k, **self.routing)
        out = self.experts(flat, self.w_gate_up, self.w_down, weights, ids)
        if self.shared:
            gate, up = self.gate_up(flat).chunk(2, dim=-1)
            out = out + self.down(F.silu(gate) * up)
        return out.view(x.shape)


class Experts(nn.Module):
    """kernels.moe's `impl` as a module of its own, so a forward hook sees each call's shapes and routing. Its
    arguments come from `route`, so the request is planned without the facade's validation (which reads the ids
    back to check their range: a device sync a server's step does not make); on the meta device (tracing shapes)
    nothing runs."""

    def __init__(self, impl: str):
        super().__init__()
        self.impl = get_impl(impl, op="moe")

    def forward(self, x, w_gate_up, w_down, weights, ids) -> torch.Tensor:
        if x.device.type == "meta":
            return torch.empty_like(x)
        return self.impl.plan(MoeRequest(x, w_gate_up, w_down, weights, ids)).run()


def mlp_projections(layer) -> list[tuple[str, nn.Module]]:
    """The linear layers of a decoder layer's MLP by name: gate_up and down (dense_gate_up and dense_down in a
    mixture's first dense layers), or a mixture's router and shared experts."""
    if layer.mixture is not None:
        return [(name, getattr(layer.mixture, name)) for name in ("router", "gate_up", "down")
                if hasattr(layer.mixture, name)]
    return [(name, getattr(layer, name)) for name in layer.mlp_names]


def experts_op(args) -> dict:
    """What a forward hook on Experts records of one call (the fields of a moe case but the routing)."""
    x, w_gate_up, _, _, ids = args
    scheme = getattr(w_gate_up, "scheme", "")  # packed experts (a QuantizedWeight stack)
    return {"op": "moe", "name": "experts", "scope": "layer", "m": x.shape[0], "n": w_gate_up.shape[1] // 2,
            "k": x.shape[1], "experts": w_gate_up.shape[0], "top_k": ids.shape[1], **({"scheme": scheme} if scheme
                                                                                       else {})}


def bare_linear(k: int, n: int, device, dtype) -> nn.Linear:
    """An nn.Linear without bias or grad whose weight the decoder fills (skip_init: no initialisation pass)."""
    layer = torch.nn.utils.skip_init(nn.Linear, k, n, bias=False, device=device, dtype=dtype)
    layer.weight.requires_grad_(False)
    return layer
