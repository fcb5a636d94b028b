"""The linear memory charge: the large GPU cases fit alike for every impl on 80 and 141 GB cards."""

from __future__ import annotations

import pytest
import torch
from phasebench.bench.ops.linear import memory
from phasebench.bench.ops.linear.cases import LinearCase
from phasebench.bench.sweep.suites import suite_cases

CUDA = torch.device("cuda")  # a device object only: with `free` given nothing touches CUDA


@pytest.mark.parametrize("free", [79e9, 140e9])
def test_the_largest_linear_cases_fit_alike_for_every_impl_on_80_and_141_GB_cards(free):
    for suite in ("decode-linear", "prefill-linear"):
        for case in suite_cases(suite, "cuda", "bfloat16"):
            verdicts = {impl: memory.does_not_fit(case, impl, CUDA, free=int(free))
                        for impl in ("naive", "torch", "triton")}
            assert all(v is None for v in verdicts.values()), (case, verdicts)
    assert "needs about" in memory.does_not_fit(LinearCase(16384, 57344, 8192, "bfloat16", "prefill"),
                                                "torch", CUDA, free=int(4e9))
