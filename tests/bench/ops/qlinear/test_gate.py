"""The gate on quantized linear layers: the built-in impls pass at awkward sizes (K no multiple of the group, N odd);
kernels with the classic int4 bugs and the served formats' bugs (MX scales per 16, e2m1's exponent bias, a misplaced
fp8 block scale), registered here as plugins, are judged incorrect."""

from __future__ import annotations

import pytest
import torch
from phasebench.bench.ops import operator_of
from phasebench.bench.ops.qlinear.cases import QLinearCase
from phasebench.bench.ops.qlinear.unpack import e4m3_values, e8m0_values, int4_codes, unpack
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


def _e2m1(codes, bias=1):
    """e2m1 values with an exponent bias (the format's is 1)."""
    sign = 1.0 - 2.0 * (codes >= 8).double()
    exponent, mantissa = (codes // 2) % 4, (codes % 2).double()
    normal = (1 + mantissa / 2) * torch.pow(2.0, (exponent - bias).double())
    return sign * torch.where(exponent == 0, mantissa * 2.0 ** (1 - bias) / 2, normal)


def _fp4_dequantized(qweight, *, group=None, bias=1):
    """mxfp4 / nvfp4 weights with one bug: each scale applied to `group` columns, or the wrong exponent bias."""
    n, k = qweight.shape
    codes = int4_codes(qweight.qdata)
    group = group or qweight.group_size
    index = torch.clamp(torch.arange(codes.shape[1]) // group, max=qweight.scales.shape[1] - 1)
    if qweight.scheme == "mxfp4":
        scales = e8m0_values(qweight.scales)
    else:
        scales = e4m3_values(qweight.scales) * float(qweight.tensor_scale)
    return (_e2m1(codes, bias) * scales[:, index])[:, :k].float()


def _fp8_block_misplaced(qweight):
    """fp8-b128 weights with the scales' block grid transposed (block (i, j) scaled by (j, i) where both exist)."""
    n, k = qweight.shape
    scales = qweight.scales.double().clone()
    side = min(scales.shape)
    scales[:side, :side] = scales[:side, :side].T.clone()
    per = scales.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
    return (e4m3_values(qweight.qdata) * per).float()


SERVED_BROKEN = {
    "mx_scales_per_16": ("mxfp4", lambda x, qw: x.float() @ _fp4_dequantized(qw, group=16).T),
    "e2m1_bias_2": ("mxfp4", lambda x, qw: x.float() @ _fp4_dequantized(qw, bias=2).T),
    "nv_scales_per_32": ("nvfp4", lambda x, qw: x.float() @ _fp4_dequantized(qw, group=32).T),
    "fp8_block_misplaced": ("fp8-b128", lambda x, qw: x.float() @ _fp8_block_misplaced(qw).T),
}


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


@pytest.fixture(scope="module")
def served_broken():
    for name, (_, math) in SERVED_BROKEN.items():
        register("qlinear", name, lambda x, qw, math=math: math(x, qw).to(x.dtype))
    yield {name: scheme for name, (scheme, _) in SERVED_BROKEN.items()}
    for name in SERVED_BROKEN:
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


@pytest.mark.parametrize("m, n, k, dtype", [(3, 300, 290, "float32"), (1, 130, 200, "bfloat16")])  # 2+ blocks a way
def test_each_served_format_bug_is_incorrect(served_broken, m, n, k, dtype):
    for scheme in ("mxfp4", "nvfp4"):  # the bugs' helper without its bug is the format: only the bug differs
        qw = CaseState(QLinearCase(m, n, k, scheme, dtype, "decode"), CPU).inputs.qweight
        assert torch.equal(_fp4_dequantized(qw).double(), unpack(qw).float().double())
    for name, scheme in served_broken.items():
        found = verdict(QLinearCase(m, n, k, scheme, dtype, "decode"), name)
        assert found.status == "incorrect", f"{name} passed the gate on {scheme} m{m} n{n} k{k}: {found}"
        assert found.error > found.limit


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["eager", "compiled"])
@pytest.mark.parametrize("scheme", ["int4-g128", "int4-g32", "int8", "fp8-e4m3", "mxfp4", "nvfp4", "fp8-b128"])
@pytest.mark.parametrize("m, n, k, dtype", AWKWARD)
def test_the_built_in_impls_pass(scheme, m, n, k, dtype, compiled):
    case = QLinearCase(m, n, k, scheme, dtype, "decode")
    for impl in available_impls("cpu", op="qlinear"):
        # compiled's seconds a shape: the slow tier's
        if impl in BROKEN or impl in SERVED_BROKEN or (impl == "compiled") != compiled:
            continue
        info = SCHEMES[scheme]
        try:
            found = verdict(case, impl)
        except Unsupported:  # torch: fp8 and fp4, or N not a multiple of 16 for int4
            assert impl == "torch" and (info.codes in ("e4m3", "e2m1") or n % 16)
            continue
        assert found.ok, f"{impl} failed the gate on {case.shape_label}: {found}"
