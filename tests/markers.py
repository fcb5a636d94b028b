"""Where tests run: `cuda` marks a test that needs CUDA (skipped elsewhere; `pytest -m cuda` selects the set)."""

from __future__ import annotations

import pytest
from phasebench.kernels import triton_mode

# Triton takes host tensors in its interpreter and CUDA tensors when compiled: where it compiles, its tests need CUDA.
TRITON_MARKS = [] if triton_mode.interpreted() else [pytest.mark.cuda]
TRITON_DEVICE = "cpu" if triton_mode.interpreted() else "cuda"


def on_triton_device(test):
    """The test as is in the interpreter; a CUDA test where Triton compiles."""
    for mark in TRITON_MARKS:
        test = mark(test)
    return test


# Implementations that compile on their first call (torch.compile: seconds a shape, cold): their full peer matrices
# run in the slow tier; each has a default-tier test module of a few shapes (test_flex.py, test_compiled_ops.py).
COMPILED_IMPLS = frozenset({"flex", "compiled"})


def tiered(names):
    """pytest params of impl names, the compiled ones marked slow."""
    return [pytest.param(name, marks=[pytest.mark.slow] if name in COMPILED_IMPLS else []) for name in names]
