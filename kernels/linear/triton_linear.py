"""The `triton` linear layer: a split-K skinny GEMM for decode-sized M, a tiled grouped GEMM for prefill."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import buffers
from ..registry import Impl, PlannedCall, add_builtin
from ..triton_cast import cast_out
from ..triton_mode import compute, interpreted, mode, multiprocessor_count, why_unavailable
from .request import LinearRequest, validate_linear

GEMV_MAX_M = 64  # up to this many rows the weights dominate the bytes: split-K skinny GEMM
MIN_BLOCK = 16  # tl.dot needs at least 16 along each dimension
MAX_SPLIT_K = 64
# the split count is chosen before autotuning picks a tile, so it counts programs at nominal sizes
SPLIT_NOMINAL_BLOCK_N = 64
SPLIT_MIN_K = 128  # no split gets fewer than this many K elements
PROGRAMS_PER_SM = 2
REDUCE_BLOCK = 1024
PATHS = ("gemv", "gemm")
BACKENDS = {"gemv": "triton-splitk-gemv", "gemm": "triton-gemm"}


@triton.jit
def _k_loop(acc, x_ptrs, w_ptrs, lo, hi, stride_xk, stride_wk, offs_k,
            EVEN_K: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc += x[:, lo:hi] @ w[lo:hi, :] for tiles whose pointers start at column lo; rows are pre-clamped."""
    for k0 in range(lo, hi, BLOCK_K):
        if EVEN_K:
            a = tl.load(x_ptrs)
            b = tl.load(w_ptrs)
        else:
            k_ok = offs_k < hi - k0
            a = tl.load(x_ptrs, mask=k_ok[None, :], other=0.0)
            b = tl.load(w_ptrs, mask=k_ok[:, None], other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
    return acc


@triton.jit
def _tile_pointers(X, W, start_m, start_n, lo, M, N, stride_xm, stride_xk, stride_wn, stride_wk,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # rows and columns past the edge are clamped to the last one, so only K needs a load mask;
    # int64 because row x stride passes 2**31 elements for large weights and long prompts
    rows = tl.minimum(start_m + tl.arange(0, BLOCK_M), M - 1).to(tl.int64)
    cols = tl.minimum(start_n + tl.arange(0, BLOCK_N), N - 1).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = X + rows[:, None] * stride_xm + (lo + offs_k[None, :]) * stride_xk
    w_ptrs = W + cols[None, :] * stride_wn + (lo + offs_k[:, None]) * stride_wk  # w read as [BLOCK_K, BLOCK_N]
    return x_ptrs, w_ptrs, offs_k


@triton.jit
def splitk_gemv_kernel(X, W, Dst, M, N, K, m_bucket, split_k,
                       stride_xm, stride_xk, stride_wn, stride_wk, stride_ds, stride_dm, stride_dn,
                       EVEN_K: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One program: BLOCK_N output columns of a BLOCK_M row block, over chunk `split` of K.

    With split_k == 1, Dst is the output; otherwise it is the fp32 partials [split_k, M, N]."""
    pid = tl.program_id(0)
    split = tl.program_id(1)
    n_blocks = tl.cdiv(N, BLOCK_N)
    start_m = (pid // n_blocks) * BLOCK_M
    start_n = (pid % n_blocks) * BLOCK_N
    # chunks are whole K blocks; with more splits than blocks the trailing chunks are empty
    chunk = tl.cdiv(tl.cdiv(K, split_k), BLOCK_K) * BLOCK_K
    lo = split * chunk
    hi = tl.minimum(lo + chunk, K)
    x_ptrs, w_ptrs, offs_k = _tile_pointers(X, W, start_m, start_n, lo, M, N, stride_xm, stride_xk,
                                            stride_wn, stride_wk, BLOCK_M, BLOCK_N, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc = _k_loop(acc, x_ptrs, w_ptrs, lo, hi, stride_xk, stride_wk, offs_k, EVEN_K, UPCAST, PRECISION, BLOCK_K)
    rows = start_m + tl.arange(0, BLOCK_M)
    cols = start_n + tl.arange(0, BLOCK_N)
    d_ptrs = (Dst + split.to(tl.int64) * stride_ds + rows.to(tl.int64)[:, None] * stride_dm
              + cols[None, :] * stride_dn)
    tl.store(d_ptrs, cast_out(acc, Dst.dtype.element_ty, UPCAST), mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def splitk_reduce_kernel(Part, Out, total, split_k, UPCAST: tl.constexpr, BLOCK: tl.constexpr):
    """Out (contiguous [M, N]) = sum over splits of Part (contiguous [split_k, M, N]), in split order."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < total
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    part_ptrs = Part + offs
    for _ in range(0, split_k):
        acc += tl.load(part_ptrs, mask=ok, other=0.0)
        part_ptrs += total  # pointer steps: split x M x N may pass 2**31 elements
    tl.store(Out + offs, cast_out(acc, Out.dtype.element_ty, UPCAST), mask=ok)


@triton.jit
def gemm_kernel(X, W, Out, M, N, K, m_bucket,
                stride_xm, stride_xk, stride_wn, stride_wk, stride_om, stride_on,
                EVEN_K: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """One program: one BLOCK_M x BLOCK_N output tile over all of K."""
    # Programs walk the tiles in bands of GROUP_M tile rows, column by column inside a band, so
    # programs running together share x row blocks and w column blocks in L2.
    pid = tl.program_id(0)
    m_tiles = tl.cdiv(M, BLOCK_M)
    n_tiles = tl.cdiv(N, BLOCK_N)
    band_size = GROUP_M * n_tiles
    band = pid // band_size
    first_m = band * GROUP_M
    band_rows = tl.minimum(m_tiles - first_m, GROUP_M)  # the last band may be shorter
    in_band = pid % band_size
    start_m = (first_m + in_band % band_rows) * BLOCK_M
    start_n = (in_band // band_rows) * BLOCK_N
    x_ptrs, w_ptrs, offs_k = _tile_pointers(X, W, start_m, start_n, 0, M, N, stride_xm, stride_xk,
                                            stride_wn, stride_wk, BLOCK_M, BLOCK_N, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc = _k_loop(acc, x_ptrs, w_ptrs, 0, K, stride_xk, stride_wk, offs_k, EVEN_K, UPCAST, PRECISION, BLOCK_K)
    rows = start_m + tl.arange(0, BLOCK_M)
    cols = start_n + tl.arange(0, BLOCK_N)
    o_ptrs = Out + rows.to(tl.int64)[:, None] * stride_om + cols[None, :] * stride_on
    tl.store(o_ptrs, cast_out(acc, Out.dtype.element_ty, UPCAST), mask=(rows[:, None] < M) & (cols[None, :] < N))


_EVEN_K = triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})

# Autotune lists for Hopper (H100/H200). They have never been compiled or run on a GPU (only lowered
# offline for sm_90): a starting point. Tiles too large for shared memory (fp32 inputs) fail and are skipped.
# M is keyed through m_bucket (next power of two), so prefill lengths do not each retune.
GEMM_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, num_warps=w, num_stages=s)
    for bm, bn, bk, w, s in [
        (128, 256, 64, 8, 3), (128, 128, 64, 8, 4), (128, 128, 128, 8, 3), (128, 128, 64, 4, 4),
        (128, 64, 64, 4, 4), (64, 128, 64, 4, 4), (64, 64, 128, 4, 3),
    ]
]
# Memory-bound: the choice is how many weight bytes each program keeps in flight.
GEMV_CONFIGS = [
    triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=s)
    for bn, bk, w, s in [
        (64, 128, 4, 4), (64, 128, 4, 3), (32, 128, 4, 4), (128, 128, 8, 3), (64, 64, 4, 4), (128, 64, 4, 4),
    ]
]

gemm_kernel_tuned = triton.autotune(GEMM_CONFIGS, key=["m_bucket", "N", "K"])(_EVEN_K(gemm_kernel))
splitk_gemv_kernel_tuned = triton.autotune(
    GEMV_CONFIGS, key=["m_bucket", "N", "K", "split_k", "BLOCK_M"])(_EVEN_K(splitk_gemv_kernel))

# The interpreter runs each program in Python and its cost is per tile step, not per element:
# fixed large tiles keep host runs to seconds (the tests force small tiles to cover the edges).
INTERPRETER_GEMM = {"BLOCK_M": 64, "BLOCK_N": 256, "BLOCK_K": 256, "GROUP_M": 4}
INTERPRETER_GEMV = {"BLOCK_N": 256, "BLOCK_K": 512}


def choose_path(m: int) -> str:
    """`gemv` (split-K skinny GEMM) for decode-sized M, `gemm` (tiled) above GEMV_MAX_M rows."""
    return "gemv" if m <= GEMV_MAX_M else "gemm"


def backend_name(path: str) -> str:
    return f"{BACKENDS[path]}:{mode()}"


def gemv_block_m(m: int) -> int:
    return min(GEMV_MAX_M, max(MIN_BLOCK, triton.next_power_of_2(m)))


def choose_split_k(m: int, n: int, k: int, multiprocessors: int) -> int:
    """Enough K chunks for about PROGRAMS_PER_SM programs per SM; 1 when the column blocks fill it."""
    programs = triton.cdiv(m, gemv_block_m(m)) * triton.cdiv(n, SPLIT_NOMINAL_BLOCK_N)
    wanted = triton.cdiv(PROGRAMS_PER_SM * multiprocessors, programs)
    return max(1, min(wanted, triton.cdiv(k, SPLIT_MIN_K), MAX_SPLIT_K))


def _launch_options(req: LinearRequest) -> dict:
    # the interpreter has no bf16/fp16 arithmetic: load, upcast to fp32, cast back at the store
    return dict(UPCAST=interpreted(), PRECISION="ieee" if req.dtype == torch.float32 else None)


def launch_gemv(req: LinearRequest, out: torch.Tensor, split_k: int) -> None:
    """Split-K skinny GEMM into `out` [M, N]; split_k > 1 goes through fp32 partials and a reduce."""
    x, w = req.x, req.w
    block_m = gemv_block_m(req.m)
    if split_k == 1:
        dst, dst_strides = out, (0, *out.stride())
    else:
        dst = buffers.empty((split_k, req.m, req.n), dtype=torch.float32, device=x.device)
        dst_strides = dst.stride()
    args = (x, w, dst, req.m, req.n, req.k, triton.next_power_of_2(req.m), split_k,
            *x.stride(), *w.stride(), *dst_strides)
    m_blocks = triton.cdiv(req.m, block_m)
    if interpreted():
        cfg = INTERPRETER_GEMV
        grid = (m_blocks * triton.cdiv(req.n, cfg["BLOCK_N"]), split_k)
        splitk_gemv_kernel[grid](*args, **_launch_options(req), BLOCK_M=block_m,
                                 EVEN_K=req.k % cfg["BLOCK_K"] == 0, **cfg)
    else:
        def grid(meta):
            return (m_blocks * triton.cdiv(req.n, meta["BLOCK_N"]), split_k)
        splitk_gemv_kernel_tuned[grid](*args, **_launch_options(req), BLOCK_M=block_m)
    if split_k > 1:
        total = req.m * req.n
        splitk_reduce_kernel[(triton.cdiv(total, REDUCE_BLOCK),)](dst, out, total, split_k, UPCAST=interpreted(),
                                                                    BLOCK=REDUCE_BLOCK)


def launch_gemm(req: LinearRequest, out: torch.Tensor) -> None:
    """Tiled GEMM with grouped program order into `out` [M, N]."""
    x, w = req.x, req.w
    args = (x, w, out, req.m, req.n, req.k, triton.next_power_of_2(req.m),
            *x.stride(), *w.stride(), *out.stride())
    if interpreted():
        cfg = INTERPRETER_GEMM
        grid = (triton.cdiv(req.m, cfg["BLOCK_M"]) * triton.cdiv(req.n, cfg["BLOCK_N"]),)
        gemm_kernel[grid](*args, **_launch_options(req), EVEN_K=req.k % cfg["BLOCK_K"] == 0, **cfg)
    else:
        def grid(meta):
            return (triton.cdiv(req.m, meta["BLOCK_M"]) * triton.cdiv(req.n, meta["BLOCK_N"]),)
        gemm_kernel_tuned[grid](*args, **_launch_options(req))


def _run(req: LinearRequest, path: str, split_k: int | None) -> torch.Tensor:
    out = buffers.empty((req.m, req.n), dtype=req.dtype, device=req.x.device)
    if path == "gemm":
        launch_gemm(req, out)
    else:
        if split_k is None:
            split_k = choose_split_k(req.m, req.n, req.k, multiprocessor_count(req.x.device))
        launch_gemv(req, out, split_k)
    return out


def triton_linear(x, w, *, path: str | None = None, split_k: int | None = None) -> torch.Tensor:
    """x [M, K] @ w [N, K].T with a path forced (`gemv` or `gemm`) and, for gemv, the split count forced."""
    req = validate_linear(x, w)
    TRITON_LINEAR.check(req)
    if path is None:
        path = choose_path(req.m)
    if path not in PATHS:
        raise ValueError(f"path: must be one of {', '.join(PATHS)} or None, got {path!r}")
    if split_k is not None:
        if path != "gemv":
            raise ValueError(f"split_k: only the gemv path splits K, got split_k={split_k!r} with path {path!r}")
        if isinstance(split_k, bool) or not isinstance(split_k, int) or not 1 <= split_k <= MAX_SPLIT_K:
            raise ValueError(f"split_k: must be an int in 1..{MAX_SPLIT_K}, got {split_k!r}")
    return _run(req, path, split_k)


def _plan(req: LinearRequest) -> PlannedCall:
    path = choose_path(req.m)
    return PlannedCall("triton", backend_name(path), lambda: _run(req, path, None))


TRITON_LINEAR = add_builtin(Impl(
    name="triton",
    summary=f"phasebench's Triton kernels: split-K skinny GEMM for M <= {GEMV_MAX_M}, tiled grouped GEMM above",
    devices=frozenset({"cpu", "cuda"}),
    dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32}),
    plan=_plan,
    unavailable=why_unavailable,
    backends=lambda device_type: f"{BACKENDS['gemv']}, {BACKENDS['gemm']} ({mode()})",
    op="linear",
    compute=compute,
))
