"""Weight-only quantization schemes: `quantize(w, scheme)` packs a float weight [N, K] (or a stack of experts
[E, N, K]) into a QuantizedWeight.

Packed layouts (N output channels, K inputs, w in the nn.Linear layout; an expert stack adds a leading E to every
tensor below; scales and zeros in w's dtype unless said):
- int8: qdata int8 [N, K]; scales [N]; w[n, k] = qdata[n, k] * scales[n] (symmetric, per output channel).
- int4-g128, int4-g32: K padded with zeros to Kp, a multiple of the group G; qdata uint8 [N, Kp / 2], byte
  (n, j) holding k = 2j in its low nibble and k = 2j + 1 in its high nibble, each an unsigned 0..15; scales and
  zeros [N, Kp / G]; w[n, k] = (q[n, k] - 8) * scales[n, k // G] + zeros[n, k // G] (zeros are float offsets,
  as in torch's int4 GEMM). The padding columns are never read against an input.
- fp8-e4m3: qdata float8_e4m3fn [N, K]; scales [N]; w[n, k] = float(qdata[n, k]) * scales[n].
- mxfp4 (OCP MX, gpt-oss's experts): K padded with zeros to a multiple of 32; qdata uint8 [N, Kp / 2] of e2m1
  codes, k = 2j in byte j's low nibble (as int4); scales float8_e8m0fnu [N, Kp / 32], a biased exponent E;
  w[n, k] = e2m1(q[n, k]) * 2^(E[n, k // 32] - 127). 4.25 bits a weight.
- nvfp4: K padded to a multiple of 16; qdata as mxfp4; scales float8_e4m3fn [N, Kp / 16]; tensor_scale fp32 []
  (one per matrix); w[n, k] = e2m1(q[n, k]) * float(scales[n, k // 16]) * tensor_scale. 4.5 bits a weight.
- fp8-b128 (DeepSeek-V3): qdata float8_e4m3fn [N, K]; scales fp32 [ceil(N / 128), ceil(K / 128)];
  w[n, k] = float(qdata[n, k]) * scales[n // 128, k // 128].
e2m1 codes are kept as uint8 pairs, not torch's float4_e2m1fn_x2, whose tensors have no copy kernels in torch 2.13;
the quantization rules (rounding, scales from amax) are in microscaled.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .microscaled import (
    dequantize_blocks,
    e2m1_values,
    quantize_fp8_blocks,
    quantize_mxfp4,
    quantize_nvfp4,
    unpack_nibbles,
)

FP8_MAX = 448.0  # the largest finite float8_e4m3fn
INT4_OFFSET = 8  # the unsigned nibble's middle, subtracted before its scale


@dataclass(frozen=True)
class Scheme:
    """A scheme: bits per stored code, the group along K sharing a scale (0: one per output channel), zeros or not,
    the codes (int, int4, e4m3, e2m1), the scales' dtype (None: the weight's), the block along N a scale also
    covers (0: one row) and whether a tensor-wide fp32 scale multiplies the rest."""

    name: str
    bits: int
    group: int = 0
    zeros: bool = False
    codes: str = "int"
    scale_dtype: torch.dtype | None = None
    block_n: int = 0
    tensor_scale: bool = False

    @property
    def qdata_dtype(self) -> torch.dtype:
        return {"int": torch.int8, "int4": torch.uint8, "e2m1": torch.uint8, "e4m3": torch.float8_e4m3fn}[self.codes]

    @property
    def packed(self) -> bool:
        """Two 4-bit codes per byte, K padded with zeros to a whole group."""
        return self.bits == 4


SCHEMES: dict[str, Scheme] = {s.name: s for s in (
    Scheme("int8", 8), Scheme("int4-g128", 4, 128, True, "int4"), Scheme("int4-g32", 4, 32, True, "int4"),
    Scheme("fp8-e4m3", 8, codes="e4m3"),
    Scheme("mxfp4", 4, 32, codes="e2m1", scale_dtype=torch.float8_e8m0fnu),
    Scheme("nvfp4", 4, 16, codes="e2m1", scale_dtype=torch.float8_e4m3fn, tensor_scale=True),
    Scheme("fp8-b128", 8, 128, codes="e4m3", scale_dtype=torch.float32, block_n=128))}
WEIGHT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def scheme_of(name) -> Scheme:
    try:
        return SCHEMES[name]
    except (KeyError, TypeError):
        raise ValueError(f"scheme: unknown scheme {name!r}, choose from {', '.join(SCHEMES)}") from None


def padded_k(k: int, scheme: Scheme) -> int:
    """K rounded up to the group for the 4-bit schemes (their packing pads K), K itself otherwise."""
    return math.ceil(k / scheme.group) * scheme.group if scheme.packed else k


def packed_layout(scheme: Scheme, shape: tuple[int, ...]) -> dict[str, tuple[int, ...] | None]:
    """The shapes of qdata, scales, zeros and tensor_scale that the scheme's layout gives for a weight `shape`
    ([N, K], or [E, N, K] for a stack of experts)."""
    *lead, n, k = shape
    lead = tuple(lead)
    if scheme.block_n:
        qdata, scales = (*lead, n, k), (*lead, -(-n // scheme.block_n), -(-k // scheme.group))
    elif scheme.group:
        kp = padded_k(k, scheme)
        qdata, scales = (*lead, n, kp // 2), (*lead, n, kp // scheme.group)
    else:
        qdata, scales = (*lead, n, k), (*lead, n)
    return {"qdata": qdata, "scales": scales, "zeros": scales if scheme.zeros else None,
            "tensor_scale": lead if scheme.tensor_scale else None}


@dataclass(frozen=True, eq=False)
class QuantizedWeight:
    """A packed weight [N, K] or expert stack [E, N, K] (`shape`) of one scheme (layouts in this module's
    docstring); `dequantize()` gives back the float weights it encodes."""

    qdata: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    scheme: str
    shape: tuple[int, ...]
    tensor_scale: torch.Tensor | None = None

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
    def tensors(self) -> tuple[torch.Tensor, ...]:
        return tuple(t for t in (self.qdata, self.scales, self.zeros, self.tensor_scale) if t is not None)

    @property
    def nbytes(self) -> int:
        """Bytes stored: what a kernel that reads each once reads."""
        return sum(t.nbytes for t in self.tensors)

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.nbytes / math.prod(self.shape)

    @property
    def experts(self) -> int:
        """The experts of a stack [E, N, K] (0 for one matrix)."""
        return self.shape[0] if len(self.shape) == 3 else 0

    def _map(self, fn, shape) -> QuantizedWeight:
        def each(t):
            return None if t is None else fn(t)
        return QuantizedWeight(fn(self.qdata), fn(self.scales), each(self.zeros), self.scheme, tuple(shape),
                               each(self.tensor_scale))

    def clone(self) -> QuantizedWeight:
        """A copy with its own storage (cold copies of a streamed weight)."""
        return self._map(torch.Tensor.clone, self.shape)

    def expert(self, e: int) -> QuantizedWeight:
        """Expert e of a stack as a [N, K] weight of its own (views)."""
        if not self.experts:
            raise ValueError(f"qweight: a single [N, K] matrix has no experts, got shape {self.shape}")
        return self._map(lambda t: t[e], self.shape[1:])

    def rows(self, start: int, stop: int) -> QuantizedWeight:
        """Output channels start:stop of a [N, K] weight as a weight of their own (views: every layout is row-major
        in N; a block-scaled one only from a block's first row)."""
        n = len(range(*slice(start, stop).indices(self.shape[0])))
        block = self.info.block_n
        if block:
            if start % block:
                raise ValueError(f"rows: {self.scheme} scales blocks of {block} rows; start {start} is inside one")
            return QuantizedWeight(self.qdata[start:stop], self.scales[start // block:-(-stop // block)], None,
                                   self.scheme, (n, self.shape[1]))
        zeros = None if self.zeros is None else self.zeros[start:stop]
        return QuantizedWeight(self.qdata[start:stop], self.scales[start:stop], zeros, self.scheme,
                               (n, self.shape[1]), self.tensor_scale)

    def nibbles(self) -> torch.Tensor:
        """4-bit schemes: the unsigned codes [..., N, Kp] (uint8, 0..15) in k order."""
        return unpack_nibbles(self.qdata)

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The weights it encodes, computed in fp32 (fp64 when asked for fp64), returned in `dtype` (default: the
        scales' dtype where it is a float weight dtype, the dtype of the weight it was made from; else fp32)."""
        dtype = dtype or (self.scales.dtype if self.scales.dtype in WEIGHT_DTYPES else torch.float32)
        math_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        *lead, n, k = self.shape
        info, scales = self.info, self.scales.to(math_dtype)
        if info.block_n:
            return dequantize_blocks(self.qdata.to(math_dtype), scales, info.block_n, dtype)
        if not info.group:
            return (self.qdata.to(math_dtype) * scales[..., None]).to(dtype)
        if info.codes == "e2m1":
            values = e2m1_values(self.nibbles(), math_dtype)
            if self.tensor_scale is not None:
                scales = scales * self.tensor_scale.to(math_dtype)[..., None, None]
        else:
            values = self.nibbles().to(math_dtype).sub_(INT4_OFFSET)
        w = values.view(*lead, n, -1, info.group).mul_(scales[..., None])
        if self.zeros is not None:
            w = w.add_(self.zeros.to(math_dtype)[..., None])
        return w.flatten(-2).to(dtype)[..., :k]  # cast, then cut: torch 2.13's host Inductor miscompiles the reverse


def check_weight(w) -> None:
    if not isinstance(w, torch.Tensor):
        raise ValueError(f"w: must be a torch.Tensor, got {type(w).__name__}")
    if w.dim() not in (2, 3) or 0 in w.shape:
        raise ValueError(f"w: must be a non-empty [N, K] matrix (the nn.Linear layout) or [E, N, K] experts, "
                         f"got shape {tuple(w.shape)}")
    if w.dtype not in WEIGHT_DTYPES:
        raise ValueError(f"w: must be float16, bfloat16 or float32 to be quantized, got {w.dtype}")
    if not torch.isfinite(w).all():
        raise ValueError("w: must be finite to be quantized (it holds NaN or inf)")


def quantize(w: torch.Tensor, scheme: str) -> QuantizedWeight:
    """Pack a float weight [N, K] or expert stack [E, N, K] (float16, bfloat16 or float32) with `scheme` (the
    module docstring's layouts); int8, int4 and fp8-e4m3 keep their scales in w's dtype, chosen so that the packed
    weights round-trip within the scheme; the served formats follow their specs (microscaled.py)."""
    info = scheme_of(scheme)
    check_weight(w)
    shape = tuple(w.shape)
    k = shape[-1]
    if info.group and info.packed and k < info.group:
        raise ValueError(f"w: K ({k}) must be at least the group size {info.group} of {scheme}")
    wf = w.float()
    if info.codes == "e2m1":
        kp = padded_k(k, info)
        if info.tensor_scale:
            qdata, scales, tensor_scale = quantize_nvfp4(wf, kp, info.group)
            return QuantizedWeight(qdata, scales, None, scheme, shape, tensor_scale)
        qdata, scales = quantize_mxfp4(wf, kp, info.group)
        return QuantizedWeight(qdata, scales, None, scheme, shape)
    if info.block_n:
        qdata, scales = quantize_fp8_blocks(wf, info.block_n)
        return QuantizedWeight(qdata, scales, None, scheme, shape)
    if info.group:
        return _quantize_groups(wf, info, w.dtype)
    top = FP8_MAX if info.name == "fp8-e4m3" else 127.0
    # the scale is rounded to its stored dtype first, so the codes are chosen against the scale the kernels use
    scales = (wf.abs().amax(dim=-1) / top).clamp_min(torch.finfo(torch.float32).tiny).to(w.dtype)
    ratio = wf / scales.float()[..., None]
    if info.name == "int8":
        qdata = ratio.round().clamp(-127, 127).to(torch.int8)
    else:
        qdata = ratio.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return QuantizedWeight(qdata.contiguous(), scales.contiguous(), None, scheme, shape)


def _quantize_groups(wf: torch.Tensor, info: Scheme, dtype: torch.dtype) -> QuantizedWeight:
    """Asymmetric 4-bit codes per group of K: the group's range split into 15 steps."""
    *lead, n, k = wf.shape
    kp = padded_k(k, info)
    groups = torch.nn.functional.pad(wf, (0, kp - k)).reshape(*lead, n, kp // info.group, info.group)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    scales = ((high - low) / 15).clamp_min(torch.finfo(dtype).tiny).to(dtype)
    zeros = (low + INT4_OFFSET * scales.float()).to(dtype)
    codes = ((groups - zeros.float()[..., None]) / scales.float()[..., None]).round() + INT4_OFFSET
    codes = codes.clamp(0, 15).to(torch.uint8).reshape(*lead, n, kp)
    qdata = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return QuantizedWeight(qdata.contiguous(), scales.contiguous(), zeros.contiguous(), info.name, tuple(wf.shape))
