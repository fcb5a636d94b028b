"""The linear reference: float64 on the host, a block of weight rows at a time."""

from __future__ import annotations

import torch
from phasebench.bench.ops.linear import reference
from phasebench.bench.ops.linear.cases import LinearCase
from phasebench.bench.ops.linear.inputs import make_inputs


def test_linear_reference_is_float64_on_the_host_and_bounded(monkeypatch):
    monkeypatch.setattr(reference, "REFERENCE_BYTES", 8 * 97 * 3)  # three weight rows at a time
    case = LinearCase(5, 97, 97, "float32", "decode")
    x = make_inputs(case, torch.device("cpu"), seed=3)
    ref = reference.reference(case, x, torch.device("cpu"))
    assert ref.dtype == torch.float64 and torch.allclose(ref, x.x.double() @ x.w.double().T, rtol=0, atol=1e-12)
    assert x.x.abs().min() > 0
