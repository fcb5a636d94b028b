"""The weight-only quantization schemes as the cost model and the analysis see them (no torch): bits per stored
weight, group along K and zeros; kernels.qlinear.schemes holds the same table beside the packing (a test keeps
the two equal)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class QuantScheme:
    """Bits per packed weight, the group along K sharing a scale (0: one per output channel), whether it stores
    zeros, the bits of a scale (0: the activation dtype's), the rows along N a scale also covers (0: one) and
    whether one fp32 scale per matrix multiplies the rest."""

    name: str
    bits: int
    group: int = 0
    zeros: bool = False
    scale_bits: int = 0
    block_n: int = 0
    tensor_scale: bool = False

    def padded_k(self, k: int) -> int:
        """K rounded up to the group for 4-bit codes (their packing pads K with zeros), K otherwise."""
        return math.ceil(k / self.group) * self.group if self.group and self.bits == 4 else k

    def scale_count(self, n: int, k: int) -> int:
        """Scales of a [N, K] weight (zeros, where stored, as many again)."""
        if self.block_n:
            return math.ceil(n / self.block_n) * math.ceil(k / self.group)
        return n * (self.padded_k(k) // self.group if self.group else 1)

    def stored_bytes(self, n: int, k: int, scale_bytes: int) -> float:
        """Bytes of a packed [N, K] weight: the codes (padding included), then its scales, zeros and tensor scale;
        `scale_bytes` is the activation dtype's, for the schemes that keep their scales in it."""
        per_scale = self.scale_bits / 8 if self.scale_bits else scale_bytes
        scales = (2 if self.zeros else 1) * self.scale_count(n, k) * per_scale
        return n * self.padded_k(k) * self.bits / 8 + scales + (4 if self.tensor_scale else 0)

    def bits_per_weight(self, n: int, k: int, scale_bytes: int) -> float:
        """Stored bits per weight of a [N, K] matrix, scales and zeros included."""
        return 8 * self.stored_bytes(n, k, scale_bytes) / (n * k)


QUANT_SCHEMES: dict[str, QuantScheme] = {s.name: s for s in (
    QuantScheme("int8", 8), QuantScheme("int4-g128", 4, 128, True), QuantScheme("int4-g32", 4, 32, True),
    QuantScheme("fp8-e4m3", 8), QuantScheme("mxfp4", 4, 32, scale_bits=8),
    QuantScheme("nvfp4", 4, 16, scale_bits=8, tensor_scale=True),
    QuantScheme("fp8-b128", 8, 128, scale_bits=32, block_n=128))}
# the short names `phases --weights` takes, and the scheme each stands for
WEIGHT_CHOICES = {"int8": "int8", "int4-g128": "int4-g128", "int4-g32": "int4-g32", "fp8": "fp8-e4m3",
                  "fp8-e4m3": "fp8-e4m3", "mxfp4": "mxfp4", "nvfp4": "nvfp4", "fp8-b128": "fp8-b128"}


def quant_scheme(name) -> QuantScheme:
    try:
        return QUANT_SCHEMES[name]
    except (KeyError, TypeError):
        raise ValueError(f"scheme: unknown scheme {name!r}, choose from {', '.join(QUANT_SCHEMES)}") from None


@dataclass(frozen=True)
class ServedFormat:
    """How a model's weights are served: its layers' projections packed by `projections`, its routed experts by
    `experts` ("": the activation dtype); the router, MLA's absorbed halves of kv_b and the lm_head stay in
    the activation dtype (bench.spec.steps.KEPT_FLOAT)."""

    projections: str = ""
    experts: str = ""

    def __post_init__(self):
        for name in ("projections", "experts"):
            if getattr(self, name):
                quant_scheme(getattr(self, name))

    @property
    def label(self) -> str:
        """`experts mxfp4`, `projections and experts fp8-b128`, or `unquantized`."""
        if self.projections and self.projections == self.experts:
            return f"projections and experts {self.projections}"
        parts = [f"{name} {getattr(self, name)}" for name in ("projections", "experts") if getattr(self, name)]
        return ", ".join(parts) or "unquantized"


# the formats the presets' checkpoints ship in (gpt-oss: MXFP4 experts, attention in bf16; DeepSeek-V3: fp8 with a
# 128 x 128 block scale on every linear layer but the router and the lm_head); the others: unquantized
SERVED_FORMATS = {"gpt-oss-20b": ServedFormat(experts="mxfp4"), "gpt-oss-120b": ServedFormat(experts="mxfp4"),
                  "deepseek-v3": ServedFormat("fp8-b128", "fp8-b128")}


def served_format(model: str) -> ServedFormat:
    """The format a preset is served in (unquantized for the others and custom models)."""
    return SERVED_FORMATS.get(model, ServedFormat())
