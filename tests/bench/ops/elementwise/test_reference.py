"""The elementwise reference and the gate's views of tuple and index outputs: wrong shapes are one-line verdicts."""

from __future__ import annotations

import torch
from phasebench.bench.instruments.gate import judge
from phasebench.bench.ops.elementwise import inputs, reference
from phasebench.kernels import elementwise

from .test_cases import CASES

CPU = torch.device("cpu")


def test_views_turn_wrong_output_shapes_into_one_line_verdicts():
    case = CASES["rotary"]
    x = inputs.make_inputs(case, CPU, 1)
    ref = reference.reference(case, x, CPU)
    q_rot, k_rot = elementwise("rotary", *x.tensors)
    assert judge((q_rot, k_rot), ref, case.dtype, 1e-2).ok
    assert "pair of tensors (q, k)" in judge(q_rot, ref, case.dtype, 1e-2).reason
    assert "output k is" in judge((q_rot, k_rot[:, :1]), ref, case.dtype, 1e-2).reason
    pick = CASES["greedy_pick"]
    logits = inputs.make_inputs(pick, CPU, 1)
    ref = reference.reference(pick, logits, CPU)
    picked = elementwise("greedy_pick", *logits.tensors)
    assert judge(picked, ref, pick.dtype, 0.0).ok
    assert not judge(logits.tensors[0].argmin(dim=1), ref, pick.dtype, 0.0).ok
    assert "must lie in [0, 4097)" in judge(picked + 4097, ref, pick.dtype, 0.0).reason
