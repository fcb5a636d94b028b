"""The served formats (mxfp4, nvfp4, fp8-b128): e2m1 rounding, scales from each block's amax as the specs say, the
packed layouts, expert stacks, against a float64 brute force written here."""

from __future__ import annotations

import math

import pytest
import torch
from phasebench.kernels import quantize
from phasebench.kernels.qlinear.microscaled import e2m1_codes, e2m1_values

MAGNITUDES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def nearest_e2m1(v: float) -> float:
    """Round to the nearest e2m1 value, ties to the even code (mantissa bit 0: the even index), saturating at 6."""
    mag = min(abs(v), 6.0)
    dist = [abs(mag - m) for m in MAGNITUDES]
    best = min(dist)
    ties = [i for i, d in enumerate(dist) if d == best]
    index = next((i for i in ties if i % 2 == 0), ties[0])
    return math.copysign(MAGNITUDES[index], v)


def weight(shape, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) * shape[-1] ** -0.5).to(dtype)


@pytest.mark.parametrize("value, expected", [
    (0.25, 0.0), (0.26, 0.5), (0.75, 1.0), (1.25, 1.0), (1.75, 2.0), (2.5, 2.0), (3.5, 4.0), (5.0, 4.0),
    (5.01, 6.0), (7.9, 6.0), (1e9, 6.0), (-0.75, -1.0), (-2.6, -3.0), (-5.0, -4.0), (0.1, 0.0)])
def test_e2m1_rounds_to_nearest_ties_to_even_and_saturates(value, expected):
    code = e2m1_codes(torch.tensor([value]))
    assert e2m1_values(code).item() == expected == nearest_e2m1(value)


def test_e2m1_codes_are_sign_exponent_mantissa():
    codes = torch.arange(16, dtype=torch.uint8)
    assert e2m1_values(codes).tolist() == MAGNITUDES + [-m for m in MAGNITUDES]
    assert torch.equal(e2m1_codes(e2m1_values(codes))[1:8], codes[1:8])  # -0 aside, each value its own code


def brute_force(w: torch.Tensor, group: int, scale_of) -> torch.Tensor:
    """Each group of K: scale_of(amax) as the spec says, then every value rounded by nearest_e2m1, in float64."""
    n, k = w.shape
    out = torch.empty(n, k, dtype=torch.float64)
    for row in range(n):
        for start in range(0, k, group):
            block = w[row, start:start + group].double()
            scale = scale_of(block.abs().max().item())
            vals = [0.0 if scale == 0 else nearest_e2m1(v / scale) * scale for v in block.tolist()]
            out[row, start:start + group] = torch.tensor(vals, dtype=torch.float64)
    return out


def test_mxfp4_follows_the_ocp_rule():
    w = weight((5, 70), seed=1)  # K = 70: the last group of 32 padded with zeros
    w[2, 32:64] = 0.0  # an all-zero block: scale 2^0
    qw = quantize(w, "mxfp4")
    assert qw.qdata.shape == (5, 48) and qw.scales.shape == (5, 3) and qw.scales.dtype == torch.float8_e8m0fnu

    def ocp(amax):  # X = 2^(floor(log2(amax)) - emax), emax = 2 for e2m1
        return 2.0 ** (math.floor(math.log2(amax)) - 2) if amax > 0 else 1.0
    assert torch.equal(qw.dequantize(torch.float64), brute_force(w, 32, ocp))
    assert qw.scales.view(torch.uint8)[2, 1].item() == 127
    codes = torch.stack((qw.qdata & 0xF, qw.qdata >> 4), -1).flatten(-2)  # k = 2j low nibble, 2j + 1 high
    assert torch.equal(e2m1_values(codes[:, :70]) * qw.scales.float().repeat_interleave(32, 1)[:, :70],
                       qw.dequantize(torch.float32))
    assert codes[:, 70:].eq(0).all()  # the padding


def test_nvfp4_follows_its_two_level_scales():
    w = weight((4, 50), seed=2)
    qw = quantize(w, "nvfp4")
    assert qw.scales.dtype == torch.float8_e4m3fn and qw.scales.shape == (4, 4) and qw.tensor_scale.shape == ()
    tensor_scale = w.abs().max().item() / (448 * 6)
    assert qw.tensor_scale.item() == pytest.approx(tensor_scale, rel=1e-6)
    t = qw.tensor_scale.item()

    def two_level(amax):  # the block's scale rounded to e4m3, against the fp32 tensor scale
        return torch.tensor(amax / 6 / t).to(torch.float8_e4m3fn).double().item() * t
    assert torch.allclose(qw.dequantize(torch.float64), brute_force(w, 16, two_level), rtol=1e-6, atol=0)


def test_fp8_b128_scales_each_128_by_128_block():
    w = weight((300, 290), seed=3)
    w[130:140] *= 50  # one block row with a larger range than the others
    qw = quantize(w, "fp8-b128")
    assert qw.qdata.dtype == torch.float8_e4m3fn and qw.scales.shape == (3, 3) and qw.scales.dtype == torch.float32
    for bn in range(3):
        for bk in range(3):
            block = w[bn * 128:(bn + 1) * 128, bk * 128:(bk + 1) * 128]
            scale = qw.scales[bn, bk].item()
            assert scale == pytest.approx(block.abs().max().item() / 448, rel=1e-6)
            back = qw.dequantize(torch.float64)[bn * 128:(bn + 1) * 128, bk * 128:(bk + 1) * 128]
            expected = (block.double() / scale).float().to(torch.float8_e4m3fn).double() * scale
            assert torch.equal(back, expected)
    assert qw.scales[1].max() > 10 * qw.scales[0].max()


@pytest.mark.parametrize("scheme, bits", [("mxfp4", 4.25), ("nvfp4", 4.5 + 32 / (128 * 256)),
                                          ("fp8-b128", 8 + 32 / (128 * 128))])
def test_bits_per_weight(scheme, bits):  # [128, 256]: the scales' share, and nvfp4's one fp32 tensor scale
    assert quantize(weight((128, 256)), scheme).bits_per_weight == pytest.approx(bits)


@pytest.mark.parametrize("scheme", ["int8", "int4-g32", "fp8-e4m3", "mxfp4", "nvfp4", "fp8-b128"])
def test_an_expert_stack_is_each_expert_packed_alone(scheme):
    w = weight((3, 37, 70), seed=4, dtype=torch.bfloat16)
    stack = quantize(w, scheme)
    assert stack.experts == 3 and stack.shape == (3, 37, 70)
    for e in range(3):
        alone, view = quantize(w[e], scheme), stack.expert(e)
        assert view.shape == (37, 70)
        assert torch.equal(view.dequantize(torch.float64), alone.dequantize(torch.float64))
    assert torch.equal(stack.dequantize(torch.float64)[1], quantize(w[1], scheme).dequantize(torch.float64))
    assert stack.nbytes == sum(quantize(w[e], scheme).nbytes for e in range(3))
