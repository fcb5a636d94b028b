"""Routed-experts cases: fields, the cost model against what the inputs hold and the experts their routing touches,
the inputs' routing, the memory charge, and the moe suites."""

from __future__ import annotations

import pytest
import torch
from phasebench.bench.ops.moe import inputs, memory
from phasebench.bench.ops.moe.cases import MoeCase, MoeSweep, flops, min_bytes, moved_bytes
from phasebench.bench.spec.routing import draw_routing
from phasebench.bench.sweep.suites import suite_cases

CPU, CUDA = torch.device("cpu"), torch.device("cuda")  # CUDA: a device object only (memory's `free` is given)


@pytest.mark.parametrize("m, routing", [(1, "uniform"), (7, "zipf-1.5"), (5, "balanced")])
def test_the_read_bytes_are_the_touched_experts_and_the_routing(m, routing):
    case = MoeCase(m, 24, 40, 12, 3, routing, "bfloat16", "decode", routing_seed=2)
    x = inputs.make_inputs(case, CPU, 1)
    touched = torch.unique(x.topk_ids).numel()
    assert case.touched_experts == touched == x.experts.touched
    per_expert = (x.w_gate_up.nbytes + x.w_down.nbytes) // 12
    read, written = moved_bytes(case)
    assert read == touched * per_expert + x.x.nbytes + x.topk_ids.nbytes + x.topk_weights.nbytes
    assert written == x.x.nbytes and min_bytes(case) == read + written and x.experts.nbytes == touched * per_expert
    slots = m * 3
    assert flops(case) == 2 * slots * 3 * 24 * 40 + 4 * slots * 24 + 2 * slots * 40
    assert case.row_fields()["touched_experts"] == touched and f"touched {touched}" in case.shape_label


def test_the_inputs_route_each_token_to_its_drawn_experts_with_softmax_weights():
    case = MoeCase(9, 16, 24, 10, 4, "zipf-1.2", "float32", "decode", routing_seed=5)
    x = inputs.make_inputs(case, CPU, 3)
    drawn = draw_routing(9, 10, 4, "zipf-1.2", 5)
    assert [set(row) for row in x.topk_ids.tolist()] == [set(row) for row in drawn.tolist()]
    assert (x.topk_weights[:, :-1] >= x.topk_weights[:, 1:]).all()  # sorted, as route gives them
    assert (x.topk_weights.sum(-1) < 1).all() and (x.topk_weights > 0).all()  # not renormalized: a softmax's
    assert x.topk_weights.max() / x.topk_weights.min() > 1.5  # unequal: a kernel that ignores them is wrong


def test_a_copy_of_the_experts_is_a_fresh_one_of_the_same_weights():
    x = inputs.make_inputs(MoeCase(2, 8, 16, 5, 2, "uniform", "float32", "decode"), CPU, 0)
    copy = x.experts.clone()
    assert torch.equal(copy.w_down, x.w_down) and copy.w_down.data_ptr() != x.w_down.data_ptr()


@pytest.mark.parametrize("change, message", [
    (dict(top_k=13), "top_k: must be at most the 12 experts"),
    (dict(routing="zipf"), "routing: must be uniform, balanced or zipf-S"),
    (dict(m=0), "m: must be a positive int"),
    (dict(routing_seed=-1), "routing_seed: must be a non-negative int"),
    (dict(phase="chunked"), "phase: must be one of"),
])
def test_bad_cases_are_one_line(change, message):
    args = dict(m=1, n=24, k=40, experts=12, top_k=3, routing="uniform", dtype="float32", phase="decode")
    with pytest.raises(ValueError, match=message) as err:
        MoeCase(**{**args, **change})
    assert "\n" not in str(err.value)


def test_the_moe_suites_sweep_the_batch_and_the_routings():
    decode = suite_cases("moe-decode", "cpu", "bfloat16")
    assert {c.routing for c in decode} == {"uniform", "zipf-1.2", "balanced"} and max(c.m for c in decode) == 256
    uniform = sorted((c for c in decode if c.routing == "uniform"), key=lambda c: c.m)
    touched = [c.touched_experts for c in uniform]
    assert touched == sorted(touched) and touched[0] == 3 and touched[-1] == 12  # grows with M until all are read
    gpu = suite_cases("moe-decode", "cuda", "bfloat16", models=("qwen3-30b-a3b",))
    assert {(c.n, c.k, c.experts, c.top_k) for c in gpu} == {(768, 2048, 128, 8)}
    assert [c.m for c in suite_cases("moe-prefill", "cpu", "float32") if c.routing == "uniform"] == [100, 257]
    with pytest.raises(ValueError, match="model: llama-3-8b is dense"):
        MoeSweep(("llama-3-8b",), (1,), "decode").cases("float32")


@pytest.mark.parametrize("free", [79e9, 140e9])
def test_the_gpu_moe_cases_fit_every_impl_on_80_and_141_GB_cards(free):
    for suite in ("moe-decode", "moe-prefill"):
        for case in suite_cases(suite, "cuda", "bfloat16"):
            verdicts = {impl: memory.does_not_fit(case, impl, CUDA, free=int(free))
                        for impl in ("naive", "torch", "triton")}
            assert all(v is None for v in verdicts.values()), (case, verdicts)
    # the first token's 6 experts, then every one of the 12
    assert [MoeCase(m, 8, 8, 12, 6, "uniform", "float32", "decode").touched_experts for m in (1, 40)] == [6, 12]
