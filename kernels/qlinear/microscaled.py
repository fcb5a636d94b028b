"""The served low-bit formats: e2m1 codes (MXFP4, NVFP4) and DeepSeek-V3's 128x128 block-scaled fp8, quantized from
a float weight and decoded back (the layouts are documented in schemes.py).

- e2m1: a nibble's bit 3 is the sign, bits 2-1 the exponent (bias 1), bit 0 the mantissa; magnitudes 0, 0.5, 1,
  1.5, 2, 3, 4, 6 for codes 0..7. A value is rounded to the nearest magnitude, ties to the even code (mantissa bit
  0), and saturates at 6.
- MXFP4 (OCP Microscaling v1.0): each block of 32 along K shares an e8m0 scale 2^(E - 127), E the block's
  floor(log2(amax)) - 2 (e2m1's largest exponent) clamped to the scale's range, E = 0 for an all-zero block.
- NVFP4: a tensor scale s_t = amax(w) / (448 * 6) in fp32; each block of 16 along K an e4m3 scale, amax(block) / 6
  / s_t rounded to e4m3; a value is w / (s_block * s_t) rounded to e2m1 (0 where the block's scale is 0).
- fp8-b128 (DeepSeek-V3): each 128x128 block of [N, K] (the last ones partial) an fp32 scale amax(block) / 448; a
  value is w / scale cast to e4m3 (round to nearest even, saturating at 448).
"""

from __future__ import annotations

import torch

E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MAX = 6.0
E2M1_EMAX = 2  # the exponent of e2m1's largest normal (4 and 6 are 1.x * 2^2)
E8M0_BIAS = 127
FP8_MAX = 448.0
# (midpoint between codes c and c + 1, whether a tie goes up): ties go to the even code
_E2M1_EDGES = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def e2m1_codes(values: torch.Tensor) -> torch.Tensor:
    """uint8 e2m1 codes (0..15) of fp32 values already divided by their scale: round to nearest, ties to even,
    saturating at +-6."""
    mag = values.abs()
    code = torch.zeros(values.shape, dtype=torch.uint8, device=values.device)
    for edge, tie_up in _E2M1_EDGES:
        code += (mag >= edge if tie_up else mag > edge).to(torch.uint8)
    return code | (values < 0).to(torch.uint8) << 3


def e2m1_values(codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The values of e2m1 codes (uint8 0..15) in `dtype`."""
    table = torch.tensor(E2M1_MAGNITUDES + tuple(-v for v in E2M1_MAGNITUDES), dtype=dtype, device=codes.device)
    return table[codes.long()]


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """[..., 2j] into byte j's low nibble and [..., 2j + 1] into its high one."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(qdata: torch.Tensor) -> torch.Tensor:
    """The codes [..., 2 * bytes] in k order: each byte's low nibble, then its high one."""
    return torch.stack((qdata & 0xF, qdata >> 4), dim=-1).flatten(-2)


def _grouped(wf: torch.Tensor, kp: int, group: int) -> torch.Tensor:
    """w [..., N, K] padded with zero columns to kp and viewed as [..., N, kp / group, group]."""
    padded = torch.nn.functional.pad(wf, (0, kp - wf.shape[-1]))
    return padded.reshape(*wf.shape[:-1], kp // group, group)


def quantize_mxfp4(wf: torch.Tensor, kp: int, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(qdata uint8 [..., N, kp / 2], scales float8_e8m0fnu [..., N, kp / group]) of an fp32 weight."""
    blocks = _grouped(wf, kp, group)
    amax = blocks.abs().amax(dim=-1)
    # floor(log2(amax)) exactly, from the float's exponent (frexp: amax = m * 2^e with m in [0.5, 1))
    exponent = torch.frexp(amax).exponent.to(torch.int32) - 1 - E2M1_EMAX
    exponent = torch.where(amax > 0, exponent, torch.zeros_like(exponent)).clamp(-E8M0_BIAS, E8M0_BIAS)
    scale = torch.ldexp(torch.ones_like(amax), exponent.to(torch.float32))
    codes = e2m1_codes(blocks / scale[..., None]).flatten(-2)
    biased = (exponent + E8M0_BIAS).to(torch.uint8)
    return pack_nibbles(codes).contiguous(), biased.view(torch.float8_e8m0fnu).contiguous()


def quantize_nvfp4(wf: torch.Tensor, kp: int, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(qdata uint8 [..., N, kp / 2], scales float8_e4m3fn [..., N, kp / group], tensor scale fp32 [...])."""
    lead = wf.shape[:-2]
    amax_t = wf.abs().flatten(-2).amax(dim=-1)
    tensor_scale = torch.where(amax_t > 0, amax_t / (FP8_MAX * E2M1_MAX), torch.ones_like(amax_t))
    blocks = _grouped(wf, kp, group)
    t = tensor_scale.reshape(*lead, 1, 1)
    scales = (blocks.abs().amax(dim=-1) / E2M1_MAX / t).clamp(max=FP8_MAX).to(torch.float8_e4m3fn)
    step = scales.float() * t
    codes = e2m1_codes(torch.where(step[..., None] > 0, blocks / step[..., None], torch.zeros_like(blocks)))
    return pack_nibbles(codes.flatten(-2)).contiguous(), scales.contiguous(), tensor_scale.contiguous()


def block_grid(n: int, k: int, block: int) -> tuple[int, int]:
    """The blocks of a [N, K] matrix along N and K (the last ones partial)."""
    return -(-n // block), -(-k // block)


def _blocks_of(wf: torch.Tensor, block: int) -> torch.Tensor:
    """w [..., N, K] padded to whole blocks and viewed as [..., N / block, block, K / block, block]."""
    n, k = wf.shape[-2:]
    bn, bk = block_grid(n, k, block)
    padded = torch.nn.functional.pad(wf, (0, bk * block - k, 0, bn * block - n))
    return padded.reshape(*wf.shape[:-2], bn, block, bk, block)


def quantize_fp8_blocks(wf: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(qdata float8_e4m3fn [..., N, K], scales fp32 [..., N / block, K / block] rounded up)."""
    n, k = wf.shape[-2:]
    blocks = _blocks_of(wf, block)
    amax = blocks.abs().amax(dim=(-3, -1))
    scales = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    ratio = (blocks / scales[..., :, None, :, None]).clamp(-FP8_MAX, FP8_MAX)
    codes = ratio.to(torch.float8_e4m3fn).flatten(-4, -3).flatten(-2)[..., :n, :k]
    return codes.contiguous(), scales.contiguous()


def dequantize_blocks(codes: torch.Tensor, scales: torch.Tensor, block: int, dtype: torch.dtype) -> torch.Tensor:
    """codes [..., N, K] (floats) times their block's scale from scales [..., N / block, K / block], in `dtype`: the
    codes padded to whole blocks and viewed as [..., N / block, block, K / block, block], cast, then cut to [N, K]
    (torch 2.13's host Inductor miscompiles an indexed or repeated scale tensor, and a cast after the cut, where one
    block row holds a partial K block)."""
    n, k = codes.shape[-2:]
    blocks = _blocks_of(codes, block) * scales[..., :, None, :, None]
    return blocks.flatten(-4, -3).flatten(-2).to(dtype)[..., :n, :k]
