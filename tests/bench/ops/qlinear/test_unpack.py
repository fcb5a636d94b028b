"""The gate's own unpacking of packed weights: against weights packed by hand from the documented layouts on awkward
shapes, every fp8 byte decoded from its bits, and a layout bug shared by the kernels' helpers that the old gate,
whose reference went through them, passed."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from phasebench.bench.ops.qlinear.cases import QLinearCase
from phasebench.bench.ops.qlinear.unpack import e4m3_values, unpack
from phasebench.bench.sweep.measure import CaseState, gate
from phasebench.kernels import QuantizedWeight, prepare_qlinear, register
from phasebench.kernels.registry import OPS

GEN = torch.Generator().manual_seed(43)


def drawn(shape, dtype):
    return (torch.rand(shape, generator=GEN, dtype=torch.float64) * 0.2 + 0.01).to(dtype)


@pytest.mark.parametrize("n,k,group,dtype", [(5, 97, 32, torch.bfloat16), (3, 129, 128, torch.float16),
                                             (17, 32, 32, torch.float32)])
def test_int4_unpacks_as_the_layout_says_on_awkward_shapes(n, k, group, dtype):
    kp = -(-k // group) * group  # K padded to whole groups
    codes = torch.randint(0, 16, (n, kp), generator=GEN)
    # byte j of a row: k = 2j in the low nibble, k = 2j + 1 in the high one (written as arithmetic, not bit moves)
    qdata = (codes[:, 0::2] + 16 * codes[:, 1::2]).to(torch.uint8)
    scales, zeros = drawn((n, kp // group), dtype), drawn((n, kp // group), dtype) - 0.1
    qw = QuantizedWeight(qdata, scales, zeros, f"int4-g{group}", (n, k))
    want = torch.tensor([[(codes[i, j].item() - 8) * scales[i, j // group].item() + zeros[i, j // group].item()
                          for j in range(k)] for i in range(n)], dtype=torch.float64)
    got = unpack(qw)
    assert got.dtype == torch.float64 and got.shape == (n, k) and torch.equal(got, want)
    assert torch.equal(unpack(qw, 2, 4), want[2:4]) and torch.equal(unpack(qw, n - 1, n + 9), want[-1:])
    assert torch.equal(qw.dequantize(torch.float64), want)  # the kernels' helper agrees on a right layout


def test_int8_unpacks_as_the_layout_says():
    codes = torch.randint(-127, 128, (7, 33), generator=GEN, dtype=torch.int8)
    scales = drawn((7,), torch.bfloat16)
    qw = QuantizedWeight(codes, scales, None, "int8", (7, 33))
    want = torch.tensor([[codes[i, j].item() * scales[i].item() for j in range(33)] for i in range(7)],
                        dtype=torch.float64)
    assert torch.equal(unpack(qw), want)


def test_every_fp8_byte_decodes_from_its_bits():
    def by_hand(byte: int) -> float:
        sign = -1.0 if byte & 0x80 else 1.0
        exponent, mantissa = (byte >> 3) & 0xF, byte & 0x7
        if exponent == 15 and mantissa == 7:
            return math.nan  # e4m3fn: no infinities, one NaN pattern per sign
        if exponent == 0:
            return sign * mantissa / 8 * 2.0 ** -6
        return sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)

    codes = torch.arange(256, dtype=torch.int64).to(torch.uint8).view(torch.float8_e4m3fn).reshape(8, 32)
    got = e4m3_values(codes).flatten()
    want = torch.tensor([by_hand(b) for b in range(256)], dtype=torch.float64)
    assert torch.equal(got.isnan(), want.isnan()) and got.isnan().sum() == 2
    assert torch.equal(got[~got.isnan()], want[~want.isnan()])
    assert (got[0x38], got[0x7E], got[0x01], got[0xC0]) == (1.0, 448.0, 2.0 ** -9, -2.0)
    finite = ~got.isnan()
    assert torch.equal(got[finite], codes.flatten().to(torch.float64)[finite])  # torch's own cast agrees
    scales = drawn((8,), torch.float16)
    qw = QuantizedWeight(codes.contiguous(), scales, None, "fp8-e4m3", (8, 32))
    assert torch.equal(unpack(qw)[finite.view(8, 32)], (got.view(8, 32) * scales.double()[:, None])[finite.view(8, 32)])


def test_an_unknown_layout_is_refused():
    qw = QuantizedWeight(torch.zeros(2, 2, dtype=torch.int8), torch.ones(2), None, "int2", (2, 2))
    with pytest.raises(ValueError, match="qweight: no documented layout to unpack for scheme 'int2'"):
        unpack(qw)


def swapped_nibbles(self):
    """A layout bug in the kernels' shared helper: the high nibble read as the even k."""
    return torch.stack((self.qdata >> 4, self.qdata & 0xF), dim=-1).reshape(self.qdata.shape[0], -1)


def follows_dequantize(x, qweight):
    """Multiplies by the weights the kernels' dequantize gives."""
    return F.linear(x, qweight.dequantize(x.dtype))


def test_a_layout_bug_shared_by_the_kernels_helpers_is_incorrect(monkeypatch):
    # with the old reference (x @ dequantize().T) this plugin, naive and torch's repacked int4 all read the nibbles
    # through the same helper: the bug moved the reference with them, and all three passed
    register("qlinear", "follows_dequantize", follows_dequantize)
    try:
        monkeypatch.setattr(QuantizedWeight, "nibbles", swapped_nibbles)
        case = QLinearCase(5, 160, 97, "int4-g32", "bfloat16", "decode")
        state = CaseState(case, torch.device("cpu"))
        for impl in ("follows_dequantize", "naive", "torch"):
            verdict = gate(state, prepare_qlinear(state.inputs.x, state.inputs.qweight, impl=impl), impl)
            assert verdict.status == "incorrect" and verdict.error > 0.1, (impl, verdict)
        monkeypatch.undo()  # the right layout again: the same plugin passes
        state = CaseState(case, torch.device("cpu"))
        call = prepare_qlinear(state.inputs.x, state.inputs.qweight, impl="follows_dequantize")
        assert gate(state, call, "follows_dequantize").ok
    finally:
        OPS["qlinear"].pop("follows_dequantize", None)


def test_e2m1_and_e8m0_decode_from_their_bits():
    from phasebench.bench.ops.qlinear.unpack import e2m1_from_bits, e8m0_values

    table = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert e2m1_from_bits(torch.arange(16)).tolist() == table + [-v for v in table]
    biased = torch.tensor([0, 1, 126, 127, 130, 254, 255], dtype=torch.uint8)
    got = e8m0_values(biased.view(torch.float8_e8m0fnu))
    assert got[:-1].tolist() == [2.0 ** (b - 127) for b in biased[:-1].tolist()] and math.isnan(got[-1])


@pytest.mark.parametrize("scheme, group", [("mxfp4", 32), ("nvfp4", 16)])
def test_fp4_unpacks_as_the_layout_says(scheme, group):
    n, k = 3, 45
    kp = -(-k // group) * group
    codes = torch.randint(0, 16, (n, kp), generator=GEN)
    qdata = (codes[:, 0::2] + 16 * codes[:, 1::2]).to(torch.uint8)
    table = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    value = [[(-1) ** (c >= 8) * table[c % 8] for c in row] for row in codes.tolist()]
    if scheme == "mxfp4":
        biased = torch.randint(120, 134, (n, kp // group), generator=GEN)
        scale = [[2.0 ** (b - 127) for b in row] for row in biased.tolist()]
        qw = QuantizedWeight(qdata, biased.to(torch.uint8).view(torch.float8_e8m0fnu), None, scheme, (n, k))
    else:
        raw = drawn((n, kp // group), torch.float32).to(torch.float8_e4m3fn)
        tensor_scale = torch.tensor(0.37)
        scale = [[v * 0.37 for v in row] for row in e4m3_values(raw).tolist()]
        qw = QuantizedWeight(qdata, raw, None, scheme, (n, k), tensor_scale)
    want = torch.tensor([[value[i][j] * scale[i][j // group] for j in range(k)] for i in range(n)], dtype=torch.float64)
    assert torch.allclose(unpack(qw), want, rtol=1e-7, atol=0)
    assert torch.allclose(qw.dequantize(torch.float64), want, rtol=1e-7, atol=0)


def test_fp8_blocks_unpack_as_the_layout_says():
    n, k = 130, 260  # two block rows (the second of 2 rows), three block columns (the last of 4)
    codes = drawn((n, k), torch.float32).to(torch.float8_e4m3fn)
    scales = drawn((2, 3), torch.float32)
    qw = QuantizedWeight(codes, scales, None, "fp8-b128", (n, k))
    values = e4m3_values(codes)
    want = torch.tensor([[values[i, j].item() * scales[i // 128, j // 128].item() for j in range(k)]
                         for i in range(n)], dtype=torch.float64)
    assert torch.allclose(unpack(qw), want, rtol=1e-12, atol=0) and torch.equal(unpack(qw, 128, 130), unpack(qw)[128:])
