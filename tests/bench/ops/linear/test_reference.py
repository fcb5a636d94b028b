"""The linear reference: float64 on every device, a block of weight rows at a time."""

from __future__ import annotations

import pytest
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


def test_every_reference_is_float64_on_a_gpu_too():
    """In fp32 on a GPU the references were the code under test: the eager elementwise ops' own math (residual_add's
    error exactly 0), the same cuBLAS SGEMM as F.linear. No GPU is needed to ask which dtype they would take."""
    from phasebench.bench.ops.attention import reference as attention_reference
    from phasebench.bench.ops.attention.cases import AttentionCase
    from phasebench.bench.ops.elementwise import reference as elementwise_reference

    gpu = torch.device("cuda", 0)
    assert reference.reference_dtype(gpu) == elementwise_reference.reference_dtype(gpu) == torch.float64
    assert attention_reference.reference_dtype(AttentionCase(1, 8, 2, 1, 4097, 64, True, "bfloat16"), gpu) \
        == torch.float64


@pytest.mark.cuda
def test_an_fp32_row_on_a_gpu_records_its_own_error_not_zero(tmp_path):
    from phasebench.bench.instruments.timing import TimerConfig
    from phasebench.bench.ops.elementwise.cases import ElementwiseCase
    from phasebench.bench.sweep import runner

    cases = [ElementwiseCase("residual_add", 37, 1001, "float32", "prefill"),
             LinearCase(7, 4099, 1031, "float32", "decode")]
    df = runner.run(runner.RunConfig(cases, ["torch"], torch.device("cuda"), tmp_path, suite="test",
                                     detect_contention=False, timer=TimerConfig(warmup_s=0.0, budget_s=0.0,
                                                                                min_samples=2, max_samples=2)))
    assert (df.status == "ok").all() and ((df.max_rel_err > 0) & (df.max_rel_err < 1e-4)).all(), df
