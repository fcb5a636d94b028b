"""The gate on quantized linear layers: the built-in impls pass at awkward sizes (K no multiple of the group, N odd);
kernels with the classic int4 bugs, registered here as plugins, are judged incorrect."""

from __future__ import annotations

import pytest
import torch
from phasebench.bench.ops import operator_of
from phasebench.bench.ops.qlinear.cases import QLinearCase
from phasebench.bench.sweep.measure import CaseState, gate
from phasebench.kernels import OPS, SCHEMES, Unsupported, available_impls, register

CPU = torch.device("cpu")


def _dequantized(qweight, *, shift=0, zeros=True, high_first=False):
    """The weights with one bug: the group boundary moved by `shift` columns, the zero dropped, or the nibbles read
    high first."""
    n, k = qweight.shape
    codes = qweight.nibbles()
    if high_first:
        codes = torch.stack((qweight.qdata >> 4, qweight.qdata & 0xF), dim=-1).reshape(n, -1)
    group = torch.clamp((torch.arange(codes.shape[1]) + shift) // qweight.group_size, max=qweight.scales.shape[1] - 1)
    w = (codes.float() - 8) * qweight.scales.float()[:, group]
    if zeros:
        w = w + qweight.zeros.float()[:, group]
    return w[:, :k]


BROKEN = {
    "group_off_by_one": lambda x, qw: x.float() @ _dequantized(qw, shift=1).T,
    "drops_the_zero": lambda x, qw: x.float() @ _dequantized(qw, zeros=False).T,
    "swapped_nibbles": lambda x, qw: x.float() @ _dequantized(qw, high_first=True).T,
}


@pytest.fixture(scope="module")
def broken():
    names = []
    for name, math in BROKEN.items():
        register("qlinear", name, lambda x, qw, math=math: math(x, qw).to(x.dtype))
        names.append(name)
    yield names
    for name in names:
        OPS["qlinear"].pop(name)


def verdict(case, impl):
    state = CaseState(case, CPU)
    return gate(state, operator_of(case).prepare(case, state.inputs, impl), impl)


AWKWARD = [(3, 37, 300, "float32"), (1, 64, 200, "bfloat16"), (2, 48, 161, "float16")]  # K no multiple of 32 or 128


@pytest.mark.parametrize("scheme", ["int4-g128", "int4-g32"])
@pytest.mark.parametrize("m, n, k, dtype", AWKWARD)
def test_each_int4_bug_is_incorrect(broken, scheme, m, n, k, dtype):
    case = QLinearCase(m, n, k, scheme, dtype, "decode")
    for name in broken:
        found = verdict(case, name)
        assert found.status == "incorrect", f"{name} passed the gate on {case.shape_label}: {found}"
        assert found.error > found.limit


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["eager", "compiled"])
@pytest.mark.parametrize("scheme", ["int4-g128", "int4-g32", "int8", "fp8-e4m3"])
@pytest.mark.parametrize("m, n, k, dtype", AWKWARD)
def test_the_built_in_impls_pass(scheme, m, n, k, dtype, compiled):
    case = QLinearCase(m, n, k, scheme, dtype, "decode")
    for impl in available_impls("cpu", op="qlinear"):
        if impl in BROKEN or (impl == "compiled") != compiled:  # compiled's seconds a shape: the slow tier's
            continue
        if impl == "compiled" and dtype != "float32" and SCHEMES[scheme].group and k % SCHEMES[scheme].group:
            continue  # torch 2.13's host Inductor miscompiles it (tests/kernels/test_compiled_ops.py, strict xfail)
        try:
            found = verdict(case, impl)
        except Unsupported:  # torch: fp8, or N not a multiple of 16 for int4
            assert impl == "torch" and (scheme == "fp8-e4m3" or n % 16)
            continue
        assert found.ok, f"{impl} failed the gate on {case.shape_label}: {found}"
