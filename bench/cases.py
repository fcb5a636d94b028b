"""The attention case type and sweeps under their contract name (docs/design.md); they live in bench/ops/attention/."""

from .ops.attention.cases import DTYPES, AttentionCase, RaggedSweep, Sweep, parse_shape

__all__ = ["DTYPES", "AttentionCase", "RaggedSweep", "Sweep", "parse_shape"]
