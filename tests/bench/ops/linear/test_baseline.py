"""The linear baseline: the product of the low-precision operands with fp32 accumulation, the output rounded once,
computed without F.linear or any registered impl."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from phasebench.bench.instruments.gate import BASELINE_CAP
from phasebench.bench.ops.linear import baseline, inputs, reference
from phasebench.bench.ops.linear.cases import LinearCase
from phasebench.kernels.registry import OPS

CPU = torch.device("cpu")
UNIT = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}


def refuse(*args, **kwargs):
    raise AssertionError("the baseline called a registered impl or F.linear")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_baseline_is_one_rounding_of_an_fp32_product_and_calls_no_impl(dtype, monkeypatch):
    for name, impl in list(OPS["linear"].items()):
        monkeypatch.setitem(OPS["linear"], name, dataclasses.replace(impl, plan=refuse))
    monkeypatch.setattr(F, "linear", refuse)
    monkeypatch.setattr(reference, "REFERENCE_BYTES", 4 * 1025 * 7)  # blocks of seven weight rows
    case = LinearCase(m=5, n=97, k=1025, dtype=dtype, phase="decode")
    x = inputs.make_inputs(case, CPU, 6)
    out = baseline.linear_in_dtype(case, x, CPU)
    by_hand = (x.x.float() @ x.w.float().T).to(x.x.dtype)
    assert out.dtype == x.x.dtype and (out != by_hand).float().mean() < 0.02
    torch.testing.assert_close(out.float(), by_hand.float(), rtol=2 * UNIT[dtype], atol=0)
    err = baseline.baseline_error(case, x, reference.reference(case, x, CPU))
    assert 0.25 * UNIT[dtype] < err <= UNIT[dtype] < BASELINE_CAP[dtype]  # the output's one rounding
    assert baseline.baseline_error(dataclasses.replace(case, dtype="float32"), x, out) is None
