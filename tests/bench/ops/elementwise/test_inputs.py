"""Elementwise inputs: seeded, never zero; kv_append's rows poisoned before a judged call."""

from __future__ import annotations

import torch
from phasebench.bench.instruments.gate import judge
from phasebench.bench.ops.elementwise import inputs, reference
from phasebench.kernels import prepare_elementwise

from .test_cases import CASES

CPU = torch.device("cpu")


def test_inputs_are_seeded_and_never_zero():
    case = CASES["rotary"]
    a, b = inputs.make_inputs(case, CPU, 7), inputs.make_inputs(case, CPU, 7)
    assert all(torch.equal(x, y) for x, y in zip(a.tensors, b.tensors, strict=True))
    assert torch.equal(a.tensors[2], torch.arange(1025 - 97, 1025)) and a.tensors[0].abs().min() > 0
    weight = inputs.make_inputs(CASES["rmsnorm"], CPU, 7).tensors[1].float()
    assert 0.8 < weight.mean() < 1.2 and weight.std() > 0.5


def test_a_no_op_kv_append_after_a_correct_one_is_incorrect():
    case = CASES["kv_append"]
    x = inputs.make_inputs(case, CPU, 3)
    ref = reference.reference(case, x, CPU)
    run = prepare_elementwise(case.kind, *x.tensors, impl="torch").run
    inputs.poison_written(case, x)
    assert judge(run(), ref, case.dtype, 0.0).ok
    inputs.poison_written(case, x)  # before the next judged call: the rows it must write are NaN
    positions = x.tensors[4]
    assert torch.isnan(x.tensors[0][positions]).all() and torch.isnan(x.tensors[1][positions]).all()
    others = torch.ones(case.cache_len, dtype=torch.bool)
    others[positions] = False
    assert torch.isfinite(x.tensors[0][others]).all()  # only the rows kv_append writes
    verdict = judge((x.tensors[0], x.tensors[1]), ref, case.dtype, 0.0)
    assert not verdict.ok and verdict.status == "incorrect" and "NaN" in verdict.reason
    assert "in place" in judge((x.tensors[0].clone(), x.tensors[1]), ref, case.dtype, 0.0).reason


def test_only_kv_append_writes_into_its_inputs():
    for kind, case in CASES.items():
        x = inputs.make_inputs(case, CPU, 5)
        before = [t.clone() for t in x.tensors]
        inputs.poison_written(case, x)
        same = all(torch.equal(a, b) for a, b in zip(before, x.tensors, strict=True))
        assert same == (kind != "kv_append"), kind
