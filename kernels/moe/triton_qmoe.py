"""The expert weight tiles of the fused MoE kernels: float stacks loaded as stored, packed ones decoded in the K loop.

A sorted block's expert offsets the stacks' pointers (qdata, scales, zeros or nvfp4's tensor scale, by their leading
strides); its tile is then one 2-D packed weight's, decoded by the quantized linear kernel's `_weight_tile` (int4's
nibbles with their group's scale and zero, mxfp4's and nvfp4's e2m1 codes times their e8m0 or e4m3 group scales,
fp8-b128's codes times their 128 x 128 block's scale, int8 and fp8-e4m3 codes unscaled). What a tile leaves out is
applied once to the fp32 accumulator (`channel_scale`): int8's and fp8-e4m3's per-channel scales, nvfp4's tensor
scale.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..qlinear.schemes import QuantizedWeight, padded_k
from ..qlinear.triton_qlinear import QMODES, _weight_tile, packed_operands

FLOAT = -1  # QMODE of a float expert stack


@triton.jit
def expert_tile(W, S, Z, rows, k0, K, Kp, stride_wn, stride_wk, stride_sn, QMODE: tl.constexpr,
                GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """[BLOCK_K, BLOCK_N]: the reduction rows k0.. of weight rows `rows` of one expert (W, S and Z at its offset);
    float weights as stored (zero past K), packed ones decoded in fp32 short of channel_scale's factors."""
    if QMODE < 0:
        ks = k0 + tl.arange(0, BLOCK_K)
        w = tl.load(W + rows[None, :] * stride_wn + ks[:, None] * stride_wk, mask=ks[:, None] < K, other=0.0)
    else:
        w = _weight_tile(W, S, Z, rows, k0, Kp, stride_wn, stride_sn, QMODE, GROUP, BLOCK_N, BLOCK_K)
    return w


@triton.jit
def channel_scale(acc, S, Z, rows, QMODE: tl.constexpr):
    """acc [BLOCK_M, BLOCK_N] times what the tiles left out: int8's and fp8-e4m3's scale of each output row `rows`,
    nvfp4's tensor scale (Z at the expert's)."""
    if QMODE == 0 or QMODE == 2:
        acc = acc * tl.load(S + rows).to(tl.float32)[None, :]
    if QMODE == 4:
        acc = acc * tl.load(Z)
    return acc


@triton.jit
def dot_tile(a, w, acc, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """acc + a @ w: in fp32 under the interpreter (UPCAST), else on a's dtype (a decoded tile rounded to it)."""
    if UPCAST:
        a = a.to(tl.float32)
        w = w.to(tl.float32)
    else:
        w = w.to(a.dtype)
    return tl.dot(a, w, acc, input_precision=PRECISION)


def expert_operands(w: torch.Tensor | QuantizedWeight, k: int) -> tuple[tuple, dict]:
    """The kernels' arguments for an expert stack whose rows reduce over k: ((W, S, Z), Kp, (stride_we, stride_wn,
    stride_wk, stride_se, stride_sn, stride_ze)) flattened, and the constexprs QMODE and GROUP. A float stack stands
    in for its own S and Z (never read); a packed one gives qlinear's byte views and its padded K."""
    if not isinstance(w, QuantizedWeight):
        return (w, w, w, k, *w.stride(), 0, 0, 0), {"QMODE": FLOAT, "GROUP": 1}
    qdata, scales, z = packed_operands(w)
    strides = (*qdata.stride(), scales.stride(0), scales.stride(1), z.stride(0))
    return (qdata, scales, z, padded_k(k, w.info), *strides), {"QMODE": QMODES[w.scheme], "GROUP": w.group_size or 1}
