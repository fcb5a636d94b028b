"""The gate's own unpacking of packed weights into float64, written from the layouts the schemes document
(kernels/qlinear/schemes.py), never through the kernels' `dequantize`: a bug there would otherwise move the reference
and the impls that share it together, and the gate would pass them.

- int8: w[n, k] = qdata[n, k] * scales[n].
- int4: byte (n, j) holds k = 2j in its low nibble and k = 2j + 1 in its high one, each unsigned; w[n, k] =
  (code - 8) * scales[n, k // G] + zeros[n, k // G]; the K padding of the last group dropped.
- fp8 e4m3 (fn): a byte's bits are a sign, 4 exponent bits (bias 7) and 3 mantissa bits; exponent 0 is subnormal,
  (m / 8) * 2^-6; exponent 15 with mantissa 7 is NaN (no infinities). Decoded from the bits, not by torch's cast.
- e2m1 (OCP MX fp4): a nibble's bit 3 is the sign, bits 2-1 the exponent (bias 1), bit 0 the mantissa; exponent 0
  is subnormal, m * 0.5; otherwise (1 + m / 2) * 2^(e - 1). k = 2j in byte j's low nibble.
- e8m0: a byte E is 2^(E - 127), 255 NaN.
- mxfp4: w[n, k] = e2m1 * e8m0(scales[n, k // 32]); nvfp4: e2m1 * e4m3(scales[n, k // 16]) * tensor_scale;
  fp8-b128: e4m3 * scales[n // 128, k // 128].
"""

from __future__ import annotations

import torch

E4M3_BIAS = 7
E2M1_BIAS = 1
E8M0_BIAS = 127
MX_GROUPS = {"mxfp4": 32, "nvfp4": 16}
FP8_BLOCK = 128
INT4_MIDDLE = 8  # the unsigned nibble's middle, subtracted before its scale


def int4_codes(qdata: torch.Tensor) -> torch.Tensor:
    """The unsigned codes [N, 2 * bytes] in k order: each byte's low nibble, then its high one."""
    byte = qdata.to(torch.int64)
    return torch.stack((byte % 16, byte // 16), dim=-1).reshape(byte.shape[0], -1)


def e4m3_values(qdata: torch.Tensor) -> torch.Tensor:
    """The float64 values of float8_e4m3fn codes, from their bits."""
    bits = qdata.view(torch.uint8).to(torch.int64)
    sign = torch.where(bits >= 128, -1.0, 1.0).to(torch.float64)
    exponent, mantissa = (bits // 8) % 16, (bits % 8).to(torch.float64)
    normal = (1.0 + mantissa / 8) * torch.pow(2.0, (exponent - E4M3_BIAS).to(torch.float64))
    value = torch.where(exponent == 0, mantissa / 8 * 2.0 ** (1 - E4M3_BIAS), normal)
    return torch.where((exponent == 15) & (mantissa == 7), torch.nan, sign * value)


def e2m1_from_bits(codes: torch.Tensor) -> torch.Tensor:
    """The float64 values of e2m1 nibbles (0..15), from their bits."""
    bits = codes.to(torch.int64)
    sign = torch.where(bits >= 8, -1.0, 1.0).to(torch.float64)
    exponent, mantissa = (bits // 2) % 4, (bits % 2).to(torch.float64)
    normal = (1.0 + mantissa / 2) * torch.pow(2.0, (exponent - E2M1_BIAS).to(torch.float64))
    return sign * torch.where(exponent == 0, mantissa / 2, normal)


def e8m0_values(scales: torch.Tensor) -> torch.Tensor:
    """The float64 powers of two of e8m0 bytes."""
    biased = scales.view(torch.uint8).to(torch.int64)
    return torch.where(biased == 255, torch.nan, torch.pow(2.0, (biased - E8M0_BIAS).to(torch.float64)))


def _microscaled(qweight, rows: slice, k: int) -> torch.Tensor:
    group = MX_GROUPS[qweight.scheme]
    values = e2m1_from_bits(int4_codes(qweight.qdata[rows]))
    raw = qweight.scales[rows]
    scales = e8m0_values(raw) if qweight.scheme == "mxfp4" else e4m3_values(raw) * float(qweight.tensor_scale)
    per_k = torch.arange(values.shape[1], device=values.device) // group
    return (values * scales[:, per_k])[:, :k]


def _fp8_blocks(qweight, rows: slice, k: int) -> torch.Tensor:
    n_index = torch.arange(qweight.shape[0], device=qweight.qdata.device)[rows] // FP8_BLOCK
    k_index = torch.arange(k, device=qweight.qdata.device) // FP8_BLOCK
    scales = qweight.scales.to(torch.float64)[n_index][:, k_index]
    return e4m3_values(qweight.qdata[rows]) * scales


def unpack(qweight, start: int = 0, stop: int | None = None) -> torch.Tensor:
    """Output channels start:stop of a packed weight as float64 [rows, K], from the scheme's documented layout."""
    n, k = qweight.shape
    rows = slice(start, n if stop is None else min(stop, n))
    scales = qweight.scales[rows].to(torch.float64)
    if qweight.scheme == "int8":
        return qweight.qdata[rows].to(torch.float64) * scales[:, None]
    if qweight.scheme in MX_GROUPS:
        return _microscaled(qweight, rows, k)
    if qweight.scheme == "fp8-b128":
        return _fp8_blocks(qweight, rows, k)
    if qweight.scheme == "fp8-e4m3":
        return e4m3_values(qweight.qdata[rows]) * scales[:, None]
    if not qweight.scheme.startswith("int4-g"):
        raise ValueError(f"qweight: no documented layout to unpack for scheme {qweight.scheme!r}")
    group = int(qweight.scheme.removeprefix("int4-g"))
    codes = int4_codes(qweight.qdata[rows]).to(torch.float64) - INT4_MIDDLE
    per_k = torch.arange(codes.shape[1], device=codes.device) // group  # each k's group
    w = codes * scales[:, per_k] + qweight.zeros[rows].to(torch.float64)[:, per_k]
    return w[:, :k]
