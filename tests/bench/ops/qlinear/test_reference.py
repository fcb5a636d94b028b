"""The quantized linear reference: x @ the dequantized weights in fp64, block by block, equal to the whole product."""

from __future__ import annotations

import torch
from phasebench.bench.ops.linear import reference as linear_reference
from phasebench.bench.ops.qlinear import inputs, reference
from phasebench.bench.ops.qlinear.cases import QLinearCase

CPU = torch.device("cpu")


def test_the_reference_is_the_fp64_product_of_the_dequantized_weights(monkeypatch):
    monkeypatch.setattr(linear_reference, "REFERENCE_BYTES", 8 * 290 * 7)  # blocks of seven weight rows
    monkeypatch.setattr(reference, "REFERENCE_BYTES", 8 * 290 * 7)
    case = QLinearCase(3, 37, 290, "int4-g32", "bfloat16", "decode")
    x = inputs.make_inputs(case, CPU, 4)
    out = reference.reference(case, x, CPU)
    whole = x.x.double() @ x.qweight.dequantize(torch.float64).T
    assert out.dtype == torch.float64 and torch.equal(out, whole)
