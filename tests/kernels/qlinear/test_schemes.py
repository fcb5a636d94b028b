"""quantize() and QuantizedWeight: the packed layouts, the round trip within each scheme, bits per weight, bad input."""

from __future__ import annotations

import re

import pytest
import torch
from phasebench.bench.spec.quant import QUANT_SCHEMES
from phasebench.kernels import SCHEMES, QuantizedWeight, quantize
from phasebench.kernels.qlinear.schemes import SCHEMES as KERNEL_SCHEMES

# the largest error of a round trip, in units of the weight's range per group or row (awkward N and K)
STEP = {"int8": 1 / 254, "int4-g128": 1 / 15, "int4-g32": 1 / 15, "fp8-e4m3": 1 / 16}


def weight(n, k, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=gen).mul_(k ** -0.5).to(dtype)


@pytest.mark.parametrize("scheme", list(STEP))  # the served formats' rules: test_microscaled.py
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_round_trip_stays_within_half_a_step(scheme, dtype):
    w = weight(37, 300, dtype)  # N odd, K no multiple of 32 or 128
    qw = quantize(w, scheme)
    back = qw.dequantize()
    assert back.shape == w.shape and back.dtype == dtype and qw.scales.dtype == dtype
    span = w.float().abs().amax(dim=1, keepdim=True) * 2
    err = ((back.float() - w.float()).abs() / span).max().item()
    rounding = 0 if dtype == torch.float32 else 2 ** -7  # the dequantized values rounded to bf16
    assert err <= STEP[scheme] / 2 + rounding + 1e-6, f"{scheme}: round-trip error {err:.4f} of the row's span"
    assert err > 0  # a scheme that kept every weight exactly would not be quantizing


def test_int4_packs_two_codes_per_byte_low_nibble_first():
    w = weight(16, 64)
    qw = quantize(w, "int4-g32")
    assert qw.qdata.dtype == torch.uint8 and qw.qdata.shape == (16, 32)
    assert qw.scales.shape == qw.zeros.shape == (16, 2)
    codes = qw.nibbles()
    assert torch.equal(codes[:, 0::2], qw.qdata & 0xF) and torch.equal(codes[:, 1::2], qw.qdata >> 4)
    by_hand = (codes.double() - 8) * qw.scales.double().repeat_interleave(32, 1) \
        + qw.zeros.double().repeat_interleave(32, 1)
    assert torch.equal(qw.dequantize(torch.float64), by_hand)


def test_int4_pads_k_to_its_group_and_dequantize_cuts_it():
    qw = quantize(weight(5, 130), "int4-g128")
    assert qw.qdata.shape == (5, 128) and qw.scales.shape == (5, 2)  # K = 130 padded to 256
    assert qw.dequantize().shape == (5, 130)


def test_per_channel_layouts():
    w = weight(7, 33)
    int8, fp8 = quantize(w, "int8"), quantize(w, "fp8-e4m3")
    assert int8.qdata.dtype == torch.int8 and int8.qdata.abs().max().item() == 127 and int8.zeros is None
    assert fp8.qdata.dtype == torch.float8_e4m3fn and fp8.qdata.float().abs().max().item() == 448
    assert int8.scales.shape == fp8.scales.shape == (7,)


def test_bits_per_weight_counts_the_scales_and_zeros():
    qw = quantize(weight(64, 256, torch.bfloat16), "int4-g128")
    assert qw.bits_per_weight == pytest.approx(4 + 2 * 16 / 128)
    assert qw.bits_per_weight == pytest.approx(QUANT_SCHEMES["int4-g128"].bits_per_weight(64, 256, 2))
    assert qw.nbytes == 64 * 128 + 2 * 64 * 2 * 2
    copy = qw.clone()
    assert copy.qdata.data_ptr() != qw.qdata.data_ptr() and torch.equal(copy.dequantize(), qw.dequantize())


@pytest.mark.parametrize("w, scheme, message", [
    (weight(4, 256), "int3", "scheme: unknown scheme 'int3'"),
    (weight(4, 100), "int4-g128", "w: K (100) must be at least the group size 128"),
    (weight(4, 64).to(torch.int8), "int8", "w: must be float16, bfloat16 or float32"),
    (weight(4, 64)[0], "int8", "w: must be a non-empty [N, K] matrix"),
    (weight(4, 64, torch.float64), "int8", "w: must be float16, bfloat16 or float32"),
])
def test_bad_input_is_one_line(w, scheme, message):
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        quantize(w, scheme)
    assert "\n" not in str(err.value)


def test_a_quantized_weight_is_frozen():
    qw = quantize(weight(4, 64), "int8")
    assert isinstance(qw, QuantizedWeight)
    with pytest.raises(AttributeError):
        qw.scheme = "fp8-e4m3"


@pytest.mark.parametrize("scheme", list(SCHEMES))
@pytest.mark.parametrize("n, k, dtype", [(37, 300, torch.float32), (16, 256, torch.bfloat16), (5, 130, torch.float16)])
def test_the_cost_model_counts_the_bytes_quantize_stores(scheme, n, k, dtype):
    info, spec = KERNEL_SCHEMES[scheme], QUANT_SCHEMES[scheme]
    assert (info.bits, info.group, info.zeros) == (spec.bits, spec.group, spec.zeros)
    qw = quantize(weight(n, k, dtype), scheme)
    assert qw.nbytes == spec.stored_bytes(n, k, dtype.itemsize)


def test_rows_are_a_weight_of_their_own():
    qw = quantize(weight(9, 160), "int4-g32")
    part = qw.rows(2, 7)
    assert part.shape == (5, 160) and torch.equal(part.dequantize(), qw.dequantize()[2:7])
