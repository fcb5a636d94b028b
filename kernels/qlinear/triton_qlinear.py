"""The `triton` quantized linear layer: the packed weights dequantized inside the K loop, never written out.

One kernel body serves both paths: the split-K GEMV for decode-sized M (programs over column blocks and chunks of K,
fp32 partials summed by the linear layer's reduce kernel) and the tiled GEMM above (one program per output tile
over all of K). Each K step loads an x tile and the packed weight tile, decodes it in registers (int4: the nibble
of k's parity, then (q - 8) * scale + zero of k's group; mxfp4 and nvfp4: the nibble's e2m1 value times its group's
decoded e8m0 or e4m3 scale, nvfp4's tensor scale applied once to the accumulator; fp8-b128: the code times its
128 x 128 block's scale; int8 and fp8-e4m3: the code alone, the per-channel scale applied once to the accumulator),
and accumulates x @ w in fp32. tl.dot_scaled (Triton's MX matmul) is not used: the activations stay in their float
dtype (weight-only), and the host's interpreter has no scaled dot.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import buffers
from ..linear.triton_linear import (
    GEMV_MAX_M,
    REDUCE_BLOCK,
    choose_path,
    choose_split_k,
    gemv_block_m,
    splitk_reduce_kernel,
)
from ..errors import Unsupported
from ..registry import Impl, PlannedCall, add_builtin
from ..triton_cast import cast_out
from ..triton_mode import compute, fp8_refusal, interpreted, mode, multiprocessor_count, why_unavailable
from .request import QLinearRequest, validate_qlinear
from .schemes import padded_k

BACKENDS = {"gemv": "triton-splitk-qgemv", "gemm": "triton-qgemm"}
PATHS = tuple(BACKENDS)
QMODES = {"int8": 0, "int4-g128": 1, "int4-g32": 1, "fp8-e4m3": 2, "mxfp4": 3, "nvfp4": 4, "fp8-b128": 5}
E4M3_BYTES = frozenset({"fp8-e4m3", "nvfp4", "fp8-b128"})  # schemes whose codes or scales decode as e4m3 bytes
SMODES = {"mxfp4": 1, "nvfp4": 2}  # how a group's scale is stored: 0 a float, 1 an e8m0 byte, 2 an e4m3 byte


@triton.jit
def _group_scales(S, srows, k0, n_groups, stride_sn, SMODE: tl.constexpr, GROUP: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """[BLOCK_K, BLOCK_N] fp32: scale row srows' scale of each k's group, decoded (SMODE), broadcast over the
    group's rows; groups past n_groups read 0. k0 is a multiple of BLOCK_K and of GROUP or inside one group."""
    if BLOCK_K >= GROUP:
        kg = k0 // GROUP + tl.arange(0, BLOCK_K // GROUP)
        raw = tl.load(S + srows[None, :] * stride_sn + kg[:, None], mask=kg[:, None] < n_groups, other=0)
    else:  # the block lies inside one group: k0 < n_groups * GROUP, in bounds
        raw = tl.load(S + srows * stride_sn + k0 // GROUP)[None, :]
    if SMODE == 1:  # e8m0: a biased power of two (255 is NaN), built from its fp32 bits: exact (no ex2 approximation)
        biased = raw.to(tl.int32)
        bits = tl.where(biased == 0, 0x400000, tl.where(biased == 255, 0x7FC00000, biased << 23))  # 0: 2^-127
        scale = bits.to(tl.float32, bitcast=True)
    elif SMODE == 2:
        scale = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:
        scale = raw.to(tl.float32)
    if BLOCK_K >= GROUP:
        scale = tl.reshape(tl.broadcast_to(scale[:, None, :], (BLOCK_K // GROUP, GROUP, BLOCK_N)), (BLOCK_K, BLOCK_N))
    return scale


@triton.jit
def _e2m1(code):
    """The values of e2m1 codes (int32 0..15): sign, a 2-bit exponent of bias 1, a mantissa bit."""
    exponent = (code & 7) >> 1
    mantissa = (code & 1).to(tl.float32)
    step = tl.where(exponent == 1, 0.5, tl.where(exponent == 2, 1.0, 2.0))  # 2^(exponent - 2), exact (no ex2)
    magnitude = tl.where(exponent == 0, mantissa * 0.5, (2.0 + mantissa) * step)
    return tl.where(code >= 8, -magnitude, magnitude)


@triton.jit
def _weight_tile(Q, S, Z, cols, k0, Kp, stride_qn, stride_sn, QMODE: tl.constexpr, GROUP: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The weight tile [BLOCK_K, BLOCK_N] of K rows k0.. in fp32: group- and block-scaled codes fully dequantized,
    int8 and fp8 per channel as unscaled codes (nvfp4 short of its tensor scale). Rows past K read the packing's
    zero padding or nothing (x is zero there); k0 is a multiple of BLOCK_K."""
    n_groups = tl.cdiv(Kp, GROUP)
    if QMODE == 1 or QMODE == 3 or QMODE == 4:
        # each byte once: BLOCK_K / 2 bytes per column, split into the even (low) and odd (high) k
        kb = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        byte = tl.load(Q + cols[None, :] * stride_qn + kb[:, None], mask=kb[:, None] < Kp // 2, other=0).to(tl.int32)
        pairs = tl.join(byte & 0xF, byte >> 4)  # [BLOCK_K / 2, BLOCK_N, 2]
        code = tl.reshape(tl.permute(pairs, (0, 2, 1)), (BLOCK_K, BLOCK_N))
        if QMODE == 1:  # one scale and zero per group of K rows
            scale = _group_scales(S, cols, k0, n_groups, stride_sn, 0, GROUP, BLOCK_N, BLOCK_K)
            zero = _group_scales(Z, cols, k0, n_groups, stride_sn, 0, GROUP, BLOCK_N, BLOCK_K)
            w = (code.to(tl.float32) - 8.0) * scale + zero
        else:
            scale = _group_scales(S, cols, k0, n_groups, stride_sn, QMODE - 2, GROUP, BLOCK_N, BLOCK_K)
            w = _e2m1(code) * scale
    else:
        ks = k0 + tl.arange(0, BLOCK_K)
        code = tl.load(Q + cols[None, :] * stride_qn + ks[:, None], mask=ks[:, None] < Kp, other=0)
        if QMODE == 2 or QMODE == 5:  # fp8 codes arrive as their bytes (a masked load cannot fill fp8)
            code = code.to(tl.float8e4nv, bitcast=True)
        w = code.to(tl.float32)
        if QMODE == 5:  # one scale per 128 x 128 block: row cols // 128 of the scales
            w = w * _group_scales(S, cols // 128, k0, n_groups, stride_sn, 0, GROUP, BLOCK_N, BLOCK_K)
    return w


@triton.jit
def qlinear_kernel(X, Q, S, Z, Dst, M, N, K, Kp, m_bucket, split_k,
                   stride_xm, stride_xk, stride_qn, stride_sn, stride_ds, stride_dm, stride_dn,
                   QMODE: tl.constexpr, GROUP: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One program: BLOCK_N output columns of a BLOCK_M row block over chunk `split` of K.

    With split_k == 1, Dst is the output; otherwise it is the fp32 partials [split_k, M, N]."""
    pid = tl.program_id(0)
    split = tl.program_id(1)
    n_blocks = tl.cdiv(N, BLOCK_N)
    start_m = (pid // n_blocks) * BLOCK_M
    start_n = (pid % n_blocks) * BLOCK_N
    chunk = tl.cdiv(tl.cdiv(K, split_k), BLOCK_K) * BLOCK_K  # whole K blocks; trailing chunks may be empty
    lo = split * chunk
    hi = tl.minimum(lo + chunk, K)
    # rows and columns past the edge are clamped to the last one (their results are not stored)
    rows = tl.minimum(start_m + tl.arange(0, BLOCK_M), M - 1).to(tl.int64)
    cols = tl.minimum(start_n + tl.arange(0, BLOCK_N), N - 1).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(lo, hi, BLOCK_K):
        ks = k0 + offs_k
        k_ok = ks < hi
        a = tl.load(X + rows[:, None] * stride_xm + ks[None, :] * stride_xk, mask=k_ok[None, :], other=0.0)
        w = _weight_tile(Q, S, Z, cols, k0, Kp, stride_qn, stride_sn, QMODE, GROUP, BLOCK_N, BLOCK_K)
        if BLOCK_M == 1:  # one token: multiply and reduce over K on the vector units (no MMA tile to fill)
            acc += tl.sum(a.to(tl.float32).reshape(BLOCK_K, 1) * w, axis=0)[None, :]
        else:
            if UPCAST:
                a = a.to(tl.float32)
            else:
                w = w.to(a.dtype)
            acc = tl.dot(a, w, acc, input_precision=PRECISION)
    if QMODE == 0 or QMODE == 2:  # per-channel scale, once per output
        acc = acc * tl.load(S + cols).to(tl.float32)[None, :]
    if QMODE == 4:  # nvfp4's tensor scale (Z), once per output
        acc = acc * tl.load(Z)
    out_rows = start_m + tl.arange(0, BLOCK_M)
    out_cols = start_n + tl.arange(0, BLOCK_N)
    d_ptrs = (Dst + split.to(tl.int64) * stride_ds + out_rows.to(tl.int64)[:, None] * stride_dm
              + out_cols[None, :] * stride_dn)
    tl.store(d_ptrs, cast_out(acc, Dst.dtype.element_ty, UPCAST),
             mask=(out_rows[:, None] < M) & (out_cols[None, :] < N))


# Autotune lists for Hopper: never compiled or run on a GPU here (lowered offline for sm_90), a starting point.
GEMV_CONFIGS = [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=s)
                for bn, bk, w, s in [(64, 128, 4, 4), (32, 256, 4, 3), (128, 128, 8, 3), (64, 64, 4, 4)]]
GEMM_CONFIGS = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=s)
                for bm, bn, bk, w, s in [(128, 128, 64, 8, 3), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4),
                                         (64, 64, 128, 4, 3)]]
qgemv_tuned = triton.autotune(GEMV_CONFIGS, key=["m_bucket", "N", "K", "split_k", "BLOCK_M", "QMODE"])(qlinear_kernel)
qgemm_tuned = triton.autotune(GEMM_CONFIGS, key=["m_bucket", "N", "K", "QMODE"])(qlinear_kernel)

# The interpreter's cost is per tile step: large fixed tiles keep host runs to seconds (tests force small ones).
INTERPRETER_TILES = {"gemv": {"BLOCK_N": 256, "BLOCK_K": 512}, "gemm": {"BLOCK_M": 64, "BLOCK_N": 256, "BLOCK_K": 256}}


def backend_name(path: str) -> str:
    return f"{BACKENDS[path]}:{mode()}"


def packed_operands(qw) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(Q, S, Z) as the kernels read them: fp8 codes and 1-byte scales (e8m0, e4m3) viewed as bytes (a masked load
    cannot fill fp8), Z int4's zeros or nvfp4's tensor scale (never read by the other schemes: S stands in)."""
    qdata = qw.qdata.view(torch.uint8) if qw.qdata.dtype == torch.float8_e4m3fn else qw.qdata
    scales = qw.scales.view(torch.uint8) if qw.scales.element_size() == 1 else qw.scales
    return qdata, scales, next((t for t in (qw.zeros, qw.tensor_scale) if t is not None), scales)


def _launch(req: QLinearRequest, out: torch.Tensor, path: str, split_k: int, tiles: dict | None) -> None:
    x, qw = req.x, req.qweight
    if split_k == 1:
        dst, dst_strides = out, (0, *out.stride())
    else:
        dst = buffers.empty((split_k, req.m, req.n), dtype=torch.float32, device=x.device)
        dst_strides = dst.stride()
    qdata, scales, zeros = packed_operands(qw)
    kp = padded_k(req.k, qw.info)
    args = (x, qdata, scales, zeros, dst, req.m, req.n, req.k, kp, triton.next_power_of_2(req.m), split_k,
            *x.stride(), qw.qdata.stride(0), qw.scales.stride(0), *dst_strides)
    options = dict(QMODE=QMODES[req.scheme], GROUP=qw.group_size or 1, UPCAST=interpreted(),
                   PRECISION="ieee" if req.dtype == torch.float32 else None)
    if path == "gemv":
        options["BLOCK_M"] = 1 if req.m == 1 else gemv_block_m(req.m)
    tiles = tiles or (INTERPRETER_TILES[path] if interpreted() else None)
    if tiles is not None:
        cfg = {**options, **tiles}
        grid = (triton.cdiv(req.m, cfg["BLOCK_M"]) * triton.cdiv(req.n, cfg["BLOCK_N"]), split_k)
        qlinear_kernel[grid](*args, **cfg)
    else:
        block_m = options.get("BLOCK_M")

        def grid(meta):
            return (triton.cdiv(req.m, block_m or meta["BLOCK_M"]) * triton.cdiv(req.n, meta["BLOCK_N"]), split_k)
        (qgemv_tuned if path == "gemv" else qgemm_tuned)[grid](*args, **options)
    if split_k > 1:
        total = req.m * req.n
        splitk_reduce_kernel[(triton.cdiv(total, REDUCE_BLOCK),)](dst, out, total, split_k, UPCAST=interpreted(),
                                                                    BLOCK=REDUCE_BLOCK)


def _run(req: QLinearRequest, path: str, split_k: int | None, tiles: dict | None = None) -> torch.Tensor:
    out = buffers.empty((req.m, req.n), dtype=req.dtype, device=req.x.device)
    if path == "gemm":
        split_k = 1
    elif split_k is None:
        split_k = choose_split_k(req.m, req.n, req.k, multiprocessor_count(req.x.device))
    _launch(req, out, path, split_k, tiles)
    return out


def triton_qlinear(x, qweight, *, path: str | None = None, split_k: int | None = None,
                   tiles: dict | None = None) -> torch.Tensor:
    """x [M, K] @ the dequantized qweight.T with a path (`gemv` or `gemm`), a split count (gemv) or the tile sizes
    (BLOCK_N, BLOCK_K, and BLOCK_M for gemm) forced, as the tests do to reach the edges."""
    req = validate_qlinear(x, qweight)
    TRITON_QLINEAR.check(req)
    refuse_e4m3(req.scheme, req.x.device)
    path = path or choose_path(req.m)
    if path not in PATHS:
        raise ValueError(f"path: must be one of {', '.join(PATHS)} or None, got {path!r}")
    if split_k is not None and (path != "gemv" or isinstance(split_k, bool) or not isinstance(split_k, int)
                                or split_k < 1):
        raise ValueError(f"split_k: a positive int, with the gemv path only; got {split_k!r} with path {path!r}")
    return _run(req, path, split_k, tiles)


def refuse_e4m3(scheme: str, device: torch.device) -> None:
    """Unsupported where the scheme's e4m3 bytes cannot be decoded by Triton on this device (before sm_89)."""
    if scheme in E4M3_BYTES and (why := fp8_refusal(device, f"naive dequantizes {scheme} here")):
        raise Unsupported(why)


def _plan(req: QLinearRequest) -> PlannedCall:
    refuse_e4m3(req.scheme, req.x.device)
    path = choose_path(req.m)
    return PlannedCall("triton", backend_name(path), lambda: _run(req, path, None))


def _compute(device_type: str, dtype: torch.dtype, fields) -> str:
    """One token (BLOCK_M == 1) multiplies in fp32 on the vector units; more, tl.dot on x's dtype (triton_mode)."""
    return "float32" if fields.get("m") == 1 else compute(device_type, dtype, fields)


TRITON_QLINEAR = add_builtin(Impl(
    name="triton",
    summary=f"phasebench's Triton kernels, dequantizing in the K loop: split-K GEMV for M <= {GEMV_MAX_M}, tiled GEMM",
    devices=frozenset({"cpu", "cuda"}),
    dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32}),
    plan=_plan,
    unavailable=why_unavailable,
    backends=lambda device_type: f"{BACKENDS['gemv']}, {BACKENDS['gemm']} ({mode()})",
    op="qlinear",
    compute=_compute,
))
