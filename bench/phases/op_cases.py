"""The measured case each op of a composed step names (bench.spec.steps.OpUse -> its operator's case)."""

from __future__ import annotations

from ..ops.attention.cases import AttentionCase
from ..ops.elementwise.cases import ElementwiseCase
from ..ops.linear.cases import LinearCase
from ..ops.mla.cases import MLACase
from ..ops.moe.cases import MoeCase
from ..ops.qlinear.cases import QLinearCase
from ..spec import steps as step_defs

CASE_TYPES = {"attention": AttentionCase, "linear": LinearCase, "elementwise": ElementwiseCase,
              "qlinear": QLinearCase, "moe": MoeCase, "mla": MLACase}


def case_of(use: step_defs.OpUse, dtype: str, model: str):
    """The measured case an OpUse names: its operator's case type built from the use's fields."""
    return CASE_TYPES[use.op](**use.field_dict, dtype=dtype, model=model)
