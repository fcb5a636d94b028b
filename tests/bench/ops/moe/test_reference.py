"""The routed experts' fp64 reference against the definition token by token, and the bf16 baseline: its error is the
dtype's rounding at the points a kernel writes (well under the gate's cap), more than the output's rounding alone."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from phasebench.bench.instruments.gate import BASELINE_CAP, relative_error
from phasebench.bench.ops.moe import baseline, inputs, reference
from phasebench.bench.ops.moe.cases import MoeCase

CPU = torch.device("cpu")


def by_token(x):
    """sum_j w[t, j] W_down[e] (SiLU(W_gate[e] x_t) * W_up[e] x_t), one slot at a time, in float64."""
    n = x.w_down.shape[2]
    out = torch.zeros(x.x.shape, dtype=torch.float64)
    for t in range(x.x.shape[0]):
        for j, e in enumerate(x.topk_ids[t].tolist()):
            h = x.w_gate_up[e].double() @ x.x[t].double()
            out[t] += float(x.topk_weights[t, j]) * (x.w_down[e].double() @ (F.silu(h[:n]) * h[n:]))
    return out


def test_the_reference_is_the_definition():
    case = MoeCase(11, 40, 24, 9, 3, "zipf-1.2", "bfloat16", "decode")
    x = inputs.make_inputs(case, CPU, 4)
    ref = reference.reference(case, x, CPU)
    assert ref.dtype == torch.float64 and torch.allclose(ref, by_token(x), rtol=1e-12, atol=1e-12)


def test_the_bf16_baseline_rounds_where_a_kernel_writes():
    case = MoeCase(33, 64, 96, 6, 2, "uniform", "bfloat16", "decode")
    x = inputs.make_inputs(case, CPU, 1)
    ref = reference.reference(case, x, CPU)
    error = baseline.baseline_error(case, x, ref)
    output_only = relative_error(ref.to(torch.bfloat16), ref)  # the same outputs rounded once
    assert output_only < error < BASELINE_CAP["bfloat16"] / 2
    assert baseline.moe_in_dtype(case, x, CPU).dtype == torch.bfloat16
    assert baseline.baseline_error(MoeCase(3, 8, 16, 4, 2, "uniform", "float32", "decode"), x, ref) is None
