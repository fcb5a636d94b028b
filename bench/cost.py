"""The attention cost model under its contract name (docs/design.md); it lives in bench/ops/attention/cost.py."""

from .ops.attention.cost import ELEMENT_BYTES, flops, intensity, min_bytes, pairs

__all__ = ["ELEMENT_BYTES", "flops", "intensity", "min_bytes", "pairs"]
