"""The weight-only quantization schemes as the cost model and the analysis see them (no torch): bits per stored
weight, group along K and zeros; kernels.qlinear.schemes holds the same table beside the packing (a test keeps
the two equal)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class QuantScheme:
    """Bits per packed weight, the group along K (0: one scale per output channel) and whether it stores zeros."""

    name: str
    bits: int
    group: int = 0
    zeros: bool = False

    def padded_k(self, k: int) -> int:
        """K rounded up to the group: the packed columns (int4 pads K with zeros)."""
        return math.ceil(k / self.group) * self.group if self.group else k

    def stored_bytes(self, n: int, k: int, scale_bytes: int) -> float:
        """Bytes of a packed [N, K] weight: the codes (padding included), then its scales and zeros."""
        kp = self.padded_k(k)
        per_row = kp // self.group if self.group else 1
        return n * kp * self.bits / 8 + (2 if self.zeros else 1) * n * per_row * scale_bytes

    def bits_per_weight(self, n: int, k: int, scale_bytes: int) -> float:
        """Stored bits per weight of a [N, K] matrix, scales and zeros included."""
        return 8 * self.stored_bytes(n, k, scale_bytes) / (n * k)


QUANT_SCHEMES: dict[str, QuantScheme] = {s.name: s for s in (
    QuantScheme("int8", 8), QuantScheme("int4-g128", 4, 128, True), QuantScheme("int4-g32", 4, 32, True),
    QuantScheme("fp8-e4m3", 8))}
# the short names `phases --weights` takes, and the scheme each stands for
WEIGHT_CHOICES = {"int8": "int8", "int4-g128": "int4-g128", "int4-g32": "int4-g32", "fp8": "fp8-e4m3",
                  "fp8-e4m3": "fp8-e4m3"}


def quant_scheme(name) -> QuantScheme:
    try:
        return QUANT_SCHEMES[name]
    except (KeyError, TypeError):
        raise ValueError(f"scheme: unknown scheme {name!r}, choose from {', '.join(QUANT_SCHEMES)}") from None
