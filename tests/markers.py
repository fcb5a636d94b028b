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
