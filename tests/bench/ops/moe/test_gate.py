"""The gate on routed experts: the built-in impls pass at awkward sizes in fp32 and bf16 (M no multiple of a block,
E no power of two, an expert with a single slot, experts with none); kernels with the classic MoE bugs, registered
here as plugins, are judged incorrect: one ignores the routing weights, one drops the last expert, one swaps the gate
and up halves."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from phasebench.bench.ops import operator_of
from phasebench.bench.ops.moe.cases import MoeCase
from phasebench.bench.spec.routing import draw_routing
from phasebench.bench.sweep.measure import CaseState, gate
from phasebench.kernels import OPS, available_impls, register

CPU = torch.device("cpu")


def mixture(x, w_gate_up, w_down, weights, ids, *, use_weights=True, skip_last=False, swap=False, drop_column=False):
    """The experts token by token with one bug switched on."""
    out = torch.zeros(x.shape, dtype=torch.float32)
    n, last = w_down.shape[2], w_gate_up.shape[0] - 1
    for t in range(x.shape[0]):
        for j, e in enumerate(ids[t].tolist()):
            if skip_last and e == last:
                continue
            h = w_gate_up[e].float() @ x[t].float()
            gate, up = (h[n:], h[:n]) if swap else (h[:n], h[n:])
            act = F.silu(gate) * up
            if drop_column:  # one column of the down projection's reduction lost (a block of a tiled K loop)
                act = torch.cat([act[:-1], act.new_zeros(1)])
            out[t] += (weights[t, j] if use_weights else 1.0) * (w_down[e].float() @ act)
    return out.to(x.dtype)


BROKEN = {
    "ignores_weights": dict(use_weights=False),
    "drops_last_expert": dict(skip_last=True),
    "swaps_gate_up": dict(swap=True),
}


@pytest.fixture(scope="module")
def broken():
    for name, bug in BROKEN.items():
        register("moe", name, lambda *args, bug=bug: mixture(*args, **bug))
    yield list(BROKEN)
    for name in BROKEN:
        OPS["moe"].pop(name)


def verdict(case, impl):
    state = CaseState(case, CPU)
    return gate(state, operator_of(case).prepare(case, state.inputs, impl), impl)


# (m, n, k, experts, top_k, routing): 13 tokens of 7 experts, the last one picked often (balanced), a single
# token of 12 (most experts idle, each picked one slot alone)
AWKWARD = [(13, 24, 40, 7, 3, "balanced", "float32"), (1, 16, 72, 12, 4, "uniform", "bfloat16"),
           (19, 24, 32, 5, 2, "zipf-1.2", "bfloat16")]


@pytest.mark.parametrize("m, n, k, experts, top_k, routing, dtype", AWKWARD)
def test_each_moe_bug_is_incorrect(broken, m, n, k, experts, top_k, routing, dtype):
    case = MoeCase(m, n, k, experts, top_k, routing, dtype, "decode")
    for name in broken:
        picked = draw_routing(m, experts, top_k, routing, case.routing_seed)
        if name == "drops_last_expert" and not (picked == experts - 1).any():
            continue  # the drawn routing never picks the last expert: dropping it changes nothing
        found = verdict(case, name)
        assert found.status == "incorrect", f"{name} passed the gate on {case.shape_label}: {found}"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_down_projection_that_loses_one_column_in_224_is_incorrect(dtype):
    """1 of 224 terms of the reduction lost: the share of a 64-wide block in Mixtral's 14336, near the cap in bf16."""
    case = MoeCase(5, 224, 64, 4, 2, "uniform", dtype, "decode")
    register("moe", "drops_a_column", lambda *args: mixture(*args, drop_column=True))
    register("moe", "whole", lambda *args: mixture(*args))  # the same loop without the bug: it must pass
    try:
        found, whole = verdict(case, "drops_a_column"), verdict(case, "whole")
    finally:
        OPS["moe"].pop("drops_a_column"), OPS["moe"].pop("whole")
    assert found.status == "incorrect" and whole.ok, (found, whole)


@pytest.mark.parametrize("m, n, k, experts, top_k, routing, dtype", AWKWARD)
def test_the_built_in_impls_pass(m, n, k, experts, top_k, routing, dtype):
    case = MoeCase(m, n, k, experts, top_k, routing, dtype, "decode")
    for impl in available_impls("cpu", op="moe"):
        if impl in BROKEN:
            continue
        found = verdict(case, impl)
        assert found.ok, f"{impl} failed the gate on {case.shape_label}: {found}"
