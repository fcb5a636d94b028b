"""The elementwise memory charge: the torch impl by its temporaries, a plugin by its inputs."""

from __future__ import annotations

import torch
from phasebench.bench.ops.elementwise import memory
from phasebench.bench.ops.elementwise.cases import ElementwiseCase

CPU = torch.device("cpu")


def test_memory_charge():
    big = ElementwiseCase("rmsnorm", 16384, 8192, "bfloat16", "prefill")
    assert memory.does_not_fit(big, "torch", CPU, free=1 << 40) is None
    assert "needs about" in memory.does_not_fit(big, "torch", CPU, free=1 << 28)
    assert "charged its output plus" in memory.does_not_fit(big, "mine", CPU, free=1 << 28)
