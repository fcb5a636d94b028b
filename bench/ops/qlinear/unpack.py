"""The gate's own unpacking of packed weights into float64, written from the layouts the schemes document
(kernels/qlinear/schemes.py), never through the kernels' `dequantize`: a bug there would otherwise move the reference
and the impls that share it together, and the gate would pass them.

- int8: w[n, k] = qdata[n, k] * scales[n].
- int4: byte (n, j) holds k = 2j in its low nibble and k = 2j + 1 in its high one, each unsigned; w[n, k] =
  (code - 8) * scales[n, k // G] + zeros[n, k // G]; the K padding of the last group dropped.
- fp8 e4m3 (fn): a byte's bits are a sign, 4 exponent bits (bias 7) and 3 mantissa bits; exponent 0 is subnormal,
  (m / 8) * 2^-6; exponent 15 with mantissa 7 is NaN (no infinities). Decoded from the bits, not by torch's cast.
"""

from __future__ import annotations

import torch

E4M3_BIAS = 7
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


def unpack(qweight, start: int = 0, stop: int | None = None) -> torch.Tensor:
    """Output channels start:stop of a packed weight as float64 [rows, K], from the scheme's documented layout."""
    n, k = qweight.shape
    rows = slice(start, n if stop is None else min(stop, n))
    scales = qweight.scales[rows].to(torch.float64)
    if qweight.scheme == "int8":
        return qweight.qdata[rows].to(torch.float64) * scales[:, None]
    if qweight.scheme == "fp8-e4m3":
        return e4m3_values(qweight.qdata[rows]) * scales[:, None]
    if not qweight.scheme.startswith("int4-g"):
        raise ValueError(f"qweight: no documented layout to unpack for scheme {qweight.scheme!r}")
    group = int(qweight.scheme.removeprefix("int4-g"))
    codes = int4_codes(qweight.qdata[rows]).to(torch.float64) - INT4_MIDDLE
    per_k = torch.arange(codes.shape[1], device=codes.device) // group  # each k's group
    w = codes * scales[:, per_k] + qweight.zeros[rows].to(torch.float64)[:, per_k]
    return w[:, :k]
