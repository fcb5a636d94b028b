"""The quantized linear baseline: the dequantized weights rounded to the activation dtype, then one fp32 product with
its output rounded once, calling no registered impl and no F.linear."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from phasebench.bench.instruments.gate import BASELINE_CAP
from phasebench.bench.ops.qlinear import baseline, inputs, reference
from phasebench.bench.ops.qlinear.cases import QLinearCase
from phasebench.kernels.registry import OPS

CPU = torch.device("cpu")
UNIT = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}


def refuse(*args, **kwargs):
    raise AssertionError("the baseline called a registered impl, F.linear or a torch quantized GEMM")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("scheme", ["int4-g128", "int8", "fp8-e4m3"])
def test_the_baseline_calls_no_impl_and_errs_about_one_rounding(dtype, scheme, monkeypatch):
    for name, impl in list(OPS["qlinear"].items()):
        monkeypatch.setitem(OPS["qlinear"], name, dataclasses.replace(impl, plan=refuse))
    for op in ("_weight_int8pack_mm", "_weight_int4pack_mm_for_cpu", "_weight_int4pack_mm"):
        monkeypatch.setattr(torch, op, refuse)
    monkeypatch.setattr(F, "linear", refuse)
    case = QLinearCase(5, 97, 300, scheme, dtype, "decode")
    x = inputs.make_inputs(case, CPU, 6)
    out = baseline.qlinear_in_dtype(case, x, CPU)
    by_hand = (x.x.float() @ x.qweight.dequantize(x.x.dtype).float().T).to(x.x.dtype)
    assert out.dtype == x.x.dtype
    torch.testing.assert_close(out.float(), by_hand.float(), rtol=2 * UNIT[dtype], atol=0)
    err = baseline.baseline_error(case, x, reference.reference(case, x, CPU))
    assert 0.1 * UNIT[dtype] < err < BASELINE_CAP[dtype]
    assert baseline.baseline_error(dataclasses.replace(case, dtype="float32"), x, out) is None
