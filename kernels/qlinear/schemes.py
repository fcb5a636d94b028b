"""Weight-only quantization schemes: `quantize(w, scheme)` packs a float weight [N, K] into a QuantizedWeight.

Packed layouts (N output channels, K inputs, w in the nn.Linear layout; scales and zeros in w's dtype):
- int8: qdata int8 [N, K]; scales [N]; w[n, k] = qdata[n, k] * scales[n] (symmetric, per output channel).
- int4-g128, int4-g32: K padded with zeros to Kp, a multiple of the group G; qdata uint8 [N, Kp / 2], byte
  (n, j) holding k = 2j in its low nibble and k = 2j + 1 in its high nibble, each an unsigned 0..15; scales and
  zeros [N, Kp / G]; w[n, k] = (q[n, k] - 8) * scales[n, k // G] + zeros[n, k // G] (zeros are float offsets,
  as in torch's int4 GEMM). The padding columns are never read against an input.
- fp8-e4m3: qdata float8_e4m3fn [N, K]; scales [N]; w[n, k] = float(qdata[n, k]) * scales[n].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

FP8_MAX = 448.0  # the largest finite float8_e4m3fn
INT4_OFFSET = 8  # the unsigned nibble's middle, subtracted before its scale


@dataclass(frozen=True)
class Scheme:
    """A scheme's name, bits per stored weight, group along K (0: one scale per output channel), zeros or not."""

    name: str
    bits: int
    group: int = 0
    zeros: bool = False


SCHEMES: dict[str, Scheme] = {s.name: s for s in (
    Scheme("int8", 8), Scheme("int4-g128", 4, 128, True), Scheme("int4-g32", 4, 32, True), Scheme("fp8-e4m3", 8))}
WEIGHT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def scheme_of(name) -> Scheme:
    try:
        return SCHEMES[name]
    except (KeyError, TypeError):
        raise ValueError(f"scheme: unknown scheme {name!r}, choose from {', '.join(SCHEMES)}") from None


def padded_k(k: int, scheme: Scheme) -> int:
    """K rounded up to the scheme's group (K itself for per-channel schemes)."""
    return math.ceil(k / scheme.group) * scheme.group if scheme.group else k


@dataclass(frozen=True, eq=False)
class QuantizedWeight:
    """A packed weight [N, K] (`shape`) of one scheme (layouts in this module's docstring); `dequantize()` gives
    back the float weights it encodes."""

    qdata: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    scheme: str
    shape: tuple[int, int]

    @property
    def info(self) -> Scheme:
        return SCHEMES[self.scheme]

    @property
    def group_size(self) -> int:
        return self.info.group

    @property
    def device(self) -> torch.device:
        return self.qdata.device

    @property
    def nbytes(self) -> int:
        """Bytes stored: what a kernel that reads each once reads."""
        return sum(t.nbytes for t in (self.qdata, self.scales, self.zeros) if t is not None)

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.nbytes / (self.shape[0] * self.shape[1])

    def clone(self) -> QuantizedWeight:
        """A copy with its own storage (cold copies of a streamed weight)."""
        return QuantizedWeight(self.qdata.clone(), self.scales.clone(),
                               None if self.zeros is None else self.zeros.clone(), self.scheme, self.shape)

    def rows(self, start: int, stop: int) -> QuantizedWeight:
        """Output channels start:stop as a weight of their own (views: every layout is row-major in N)."""
        zeros = None if self.zeros is None else self.zeros[start:stop]
        return QuantizedWeight(self.qdata[start:stop], self.scales[start:stop], zeros, self.scheme,
                               (len(range(*slice(start, stop).indices(self.shape[0]))), self.shape[1]))

    def nibbles(self) -> torch.Tensor:
        """int4 schemes: the unsigned codes [N, Kp] (uint8, 0..15) in k order."""
        low, high = self.qdata & 0xF, self.qdata >> 4
        return torch.stack((low, high), dim=-1).reshape(self.qdata.shape[0], -1)

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The weights [N, K] it encodes, computed in fp32 (fp64 when asked for fp64), returned in `dtype`
        (default: the scales' dtype, the dtype of the weight it was made from)."""
        dtype = dtype or self.scales.dtype
        math_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        n, k = self.shape
        scales = self.scales.to(math_dtype)
        if self.info.group:  # codes viewed as [N, groups, G] against each group's scale and zero
            codes = self.nibbles().to(math_dtype).sub_(INT4_OFFSET).view(n, -1, self.info.group)
            w = codes.mul_(scales[..., None]).add_(self.zeros.to(math_dtype)[..., None]).view(n, -1)
            return w[:, :k].to(dtype)
        return (self.qdata.to(math_dtype) * scales[:, None]).to(dtype)


def check_weight(w) -> None:
    if not isinstance(w, torch.Tensor):
        raise ValueError(f"w: must be a torch.Tensor, got {type(w).__name__}")
    if w.dim() != 2 or 0 in w.shape:
        raise ValueError(f"w: must be a non-empty [N, K] matrix (the nn.Linear layout), got shape {tuple(w.shape)}")
    if w.dtype not in WEIGHT_DTYPES:
        raise ValueError(f"w: must be float16, bfloat16 or float32 to be quantized, got {w.dtype}")
    if not torch.isfinite(w).all():
        raise ValueError("w: must be finite to be quantized (it holds NaN or inf)")


def quantize(w: torch.Tensor, scheme: str) -> QuantizedWeight:
    """Pack a float weight [N, K] (float16, bfloat16 or float32) with `scheme` (int8, int4-g128, int4-g32,
    fp8-e4m3); scales and zeros in w's dtype, chosen so that the packed weights round-trip within the scheme."""
    info = scheme_of(scheme)
    check_weight(w)
    n, k = w.shape
    if info.group and k < info.group:
        raise ValueError(f"w: K ({k}) must be at least the group size {info.group} of {scheme}")
    wf = w.float()
    if info.group:
        return _quantize_groups(wf, info, w.dtype)
    top = FP8_MAX if info.name == "fp8-e4m3" else 127.0
    # the scale is rounded to its stored dtype first, so the codes are chosen against the scale the kernels use
    scales = (wf.abs().amax(dim=1) / top).clamp_min(torch.finfo(torch.float32).tiny).to(w.dtype)
    ratio = wf / scales.float()[:, None]
    if info.name == "int8":
        qdata = ratio.round().clamp(-127, 127).to(torch.int8)
    else:
        qdata = ratio.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return QuantizedWeight(qdata.contiguous(), scales.contiguous(), None, scheme, (n, k))


def _quantize_groups(wf: torch.Tensor, info: Scheme, dtype: torch.dtype) -> QuantizedWeight:
    """Asymmetric 4-bit codes per group of K: the group's range split into 15 steps."""
    n, k = wf.shape
    kp = padded_k(k, info)
    groups = torch.nn.functional.pad(wf, (0, kp - k)).reshape(n, kp // info.group, info.group)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    scales = ((high - low) / 15).clamp_min(torch.finfo(dtype).tiny).to(dtype)
    zeros = (low + INT4_OFFSET * scales.float()).to(dtype)
    codes = ((groups - zeros.float()[..., None]) / scales.float()[..., None]).round() + INT4_OFFSET
    codes = codes.clamp(0, 15).to(torch.uint8).reshape(n, kp)
    qdata = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return QuantizedWeight(qdata.contiguous(), scales.contiguous(), zeros.contiguous(), info.name, (n, k))
