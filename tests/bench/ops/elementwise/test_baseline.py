"""The elementwise baseline: each kind written out in the case's dtype with the eager convention's rounding points,
computed without any registered impl; copies and picks round nothing."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from phasebench.bench.instruments.gate import BASELINE_CAP, Viewed, relative_error
from phasebench.bench.ops.elementwise import baseline, inputs, reference
from phasebench.kernels import prepare_elementwise
from phasebench.kernels.registry import OPS

from .test_cases import CASES

CPU = torch.device("cpu")
UNIT = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}


def refuse(*args, **kwargs):
    raise AssertionError("the baseline called a registered impl")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("kind", list(CASES))
def test_each_kind_errs_a_few_roundings_and_calls_no_impl(kind, dtype, monkeypatch):
    case = dataclasses.replace(CASES[kind], dtype=dtype)
    x = inputs.make_inputs(case, CPU, 8)
    ref = reference.reference(case, x, CPU)
    eager = prepare_elementwise(case.kind, *x.tensors, impl="torch").run()  # before the impls are taken away
    tensor, view = (ref.tensor, ref.view) if isinstance(ref, Viewed) else (ref, lambda out: out)
    for name, impl in list(OPS["elementwise"].items()):
        monkeypatch.setitem(OPS["elementwise"], name, dataclasses.replace(impl, plan=refuse))
    monkeypatch.setattr(F, "silu", refuse)
    err = baseline.baseline_error(case, x, ref)
    if kind in ("kv_append", "greedy_pick"):  # a copy and a max round nothing
        assert err == 0.0
        return
    assert 0.1 * UNIT[dtype] < err < 2 * UNIT[dtype] <= BASELINE_CAP[dtype]
    eager_err = relative_error(view(eager), tensor)  # the eager impl rounds at the same points
    assert 0.5 * err <= eager_err <= 2 * err


def test_fp32_has_no_baseline():
    case = dataclasses.replace(CASES["rotary"], dtype="float32")
    x = inputs.make_inputs(case, CPU, 1)
    assert baseline.baseline_error(case, x, reference.reference(case, x, CPU)) is None
