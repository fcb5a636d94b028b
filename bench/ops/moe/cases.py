"""Routed-experts cases (x [M, K] through each token's top-k of E experts of intermediate N, float or packed by a
weight scheme), their cost model (the experts a call touches), and their sweeps over a model's mixture-of-experts
layer."""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, fields

from ...spec.models import model_config, parse_model
from ...spec.quant import quant_scheme
from ...spec.routing import check_routing, touched_experts
from ..linear.cases import ELEMENT_BYTES, LINEAR_PHASES

ROUTING_BYTES = 4 + 4  # per slot: a float32 weight and an int32 id
ACTIVATION_FLOPS = 4  # per intermediate element: SiLU's exp, add and divide, and the product with up


@dataclass(frozen=True)
class MoeCase:
    """One routed-experts layer at M tokens: k = the hidden size, n = each expert's intermediate size, the tokens
    routed by `routing` (uniform, balanced, zipf-S) drawn from `routing_seed`."""

    m: int
    n: int
    k: int
    experts: int
    top_k: int
    routing: str
    dtype: str
    phase: str
    model: str = ""
    projection: str = "experts"
    routing_seed: int = 0
    scheme: str = ""

    op = "moe"

    def __post_init__(self):
        for name in ("n", "k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be a positive int, got {value!r}")
        check_routing(self.m, self.experts, self.top_k, self.routing)
        if isinstance(self.routing_seed, bool) or not isinstance(self.routing_seed, int) or self.routing_seed < 0:
            raise ValueError(f"routing_seed: must be a non-negative int, got {self.routing_seed!r}")
        if self.dtype not in ELEMENT_BYTES:
            raise ValueError(f"dtype: must be one of {', '.join(ELEMENT_BYTES)}, got {self.dtype!r}")
        if self.phase not in LINEAR_PHASES:
            raise ValueError(f"phase: must be one of {', '.join(LINEAR_PHASES)}, got {self.phase!r}")
        if self.scheme:
            info = quant_scheme(self.scheme)
            if info.bits == 4 and min(self.n, self.k) < info.group:
                raise ValueError(f"scheme: {self.scheme} packs groups of {info.group} along K and N (w_down reduces "
                                 f"over N), got k {self.k}, n {self.n}")

    def __repr__(self) -> str:
        # the dataclass repr with scheme shown only when set: repr seeds a case's inputs (sweep.measure.case_seed),
        # so float cases keep the seeds they had before it
        shown = (f for f in fields(self) if f.name != "scheme" or self.scheme)
        return f"{type(self).__qualname__}({', '.join(f'{f.name}={getattr(self, f.name)!r}' for f in shown)})"

    @functools.cached_property
    def touched_experts(self) -> int:
        """Distinct experts the case's routing sends a token to: the experts whose weights a call reads."""
        return touched_experts(self.m, self.experts, self.top_k, self.routing, self.routing_seed)

    @property
    def shape_label(self) -> str:
        """Short shape text for tables: experts m8 n768 k2048 e128/8 uniform (touched 53)."""
        packed = f" {self.scheme} {self.bits_per_weight:.3g}b" if self.scheme else ""
        return (f"{self.projection + ' ' if self.projection else ''}m{self.m} n{self.n} k{self.k} "
                f"e{self.experts}/{self.top_k}{packed} {self.routing} (touched {self.touched_experts})")

    @property
    def bits_per_weight(self) -> float:
        """Stored bits per expert weight, scales included (the float dtype's bits when unpacked)."""
        return 8 * expert_weights(self, 1) / (3 * self.n * self.k)

    def fields(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def row_fields(self) -> dict:
        """The case's columns in a result row, the touched experts with them (scheme only where set)."""
        out = {k: v for k, v in self.fields().items() if k != "scheme" or v}
        return {**out, "op": self.op, "touched_experts": self.touched_experts}


def expert_weights(case: MoeCase, experts: int) -> float:
    """Weights of `experts` experts (gate, up and down, 3 N K each) in bytes; packed: each expert's w_gate_up
    [2N, K] and w_down [K, N] as stored, codes plus scales (in the activation dtype for int8, int4 and fp8-e4m3),
    zeros and tensor scale."""
    elem = ELEMENT_BYTES[case.dtype]
    if not case.scheme:
        return float(elem * experts * 3 * case.n * case.k)
    info = quant_scheme(case.scheme)
    return float(experts * (info.stored_bytes(2 * case.n, case.k, elem) + info.stored_bytes(case.k, case.n, elem)))


def flops(case: MoeCase) -> float:
    """2·M·k·3·N·K for the gate, up and down products of every (token, expert) slot, the activation
    (ACTIVATION_FLOPS per intermediate element) and the weighted sum over a token's experts (2·M·k·K)."""
    slots = case.m * case.top_k
    return 2.0 * slots * 3 * case.n * case.k + ACTIVATION_FLOPS * slots * case.n + 2.0 * slots * case.k


def moved_bytes(case: MoeCase) -> tuple[float, float]:
    """(bytes read, bytes written): the weights of the experts the call touches (never the others; packed bytes plus
    scales where a scheme packs them), x, and the routing weights and ids, read once; the output written once."""
    elem = ELEMENT_BYTES[case.dtype]
    read = expert_weights(case, case.touched_experts) + elem * case.m * case.k + ROUTING_BYTES * case.m * case.top_k
    return float(read), float(elem * case.m * case.k)


def min_bytes(case: MoeCase) -> float:
    return sum(moved_bytes(case))


@dataclass(frozen=True)
class MoeSweep:
    """The routed experts of the given mixture-of-experts models at each M, per routing, standing for one phase."""

    models: tuple[str, ...]
    m: tuple[int, ...]
    phase: str
    routings: tuple[str, ...] = ("uniform",)

    def cases(self, dtype: str, models: tuple[str, ...] | None = None) -> list[MoeCase]:
        out = []
        for model, routing, m in itertools.product(models or self.models, self.routings, self.m):
            config = parse_model(model) if "=" in model else model_config(model)  # a host spec stays unregistered
            if not config.is_moe:
                raise ValueError(f"model: {config.name} is dense (no experts); a moe suite takes a mixture of experts "
                                 "such as qwen3-30b-a3b")
            out.append(MoeCase(m, config.intermediate, config.hidden, config.experts, config.top_k, routing, dtype,
                               self.phase, config.name))
        return out
