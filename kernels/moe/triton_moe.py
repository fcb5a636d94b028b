"""The `triton` routed experts: one fused kernel per projection over blocks of slots sorted by expert (vLLM's
fused_moe layout), the alignment of the slots into blocks part of every call (bench times it).

Each program takes one block of BLOCK_M slots, all of one expert (sorting.align_blocks pads each expert's slots to
whole blocks), and BLOCK_N output columns. gate_up_kernel gathers the slots' token rows of x, multiplies them by the
expert's gate and up rows in two fp32 accumulators and writes SiLU(gate) * up once, in x's dtype, to the slot's row
of the intermediate [M * top_k, N]. down_kernel multiplies those rows by the expert's w_down, scales each by its
slot's routing weight and writes fp32 rows [M * top_k, K]; the top_k rows of a token are summed in slot order and
rounded once to x's dtype. Blocks past the used rows return at once; padding rows are read as token 0 and never
stored. Packed experts (QuantizedWeight stacks, every qlinear scheme) are decoded tile by tile in the K loops, at the
block's expert, never written out (triton_qmoe.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import buffers
from ..qlinear.triton_qlinear import refuse_e4m3
from ..registry import Impl, PlannedCall, add_builtin
from ..triton_cast import cast_out
from ..triton_mode import compute, interpreted, mode, why_unavailable
from .request import MoeRequest, validate_moe
from .sorting import Blocks, align_blocks
from .triton_qmoe import channel_scale, dot_tile, expert_operands, expert_tile

MIN_BLOCK = 16  # tl.dot needs at least 16 rows
MAX_BLOCK_M = 64
BACKEND = "triton-fused-moe"


@triton.jit
def gate_up_kernel(X, W, S, Z, Inter, Slots, BlockExpert, Used, N, K, Kp, top_k, num_slots,
                   stride_xm, stride_xk, stride_we, stride_wn, stride_wk, stride_se, stride_sn, stride_ze,
                   stride_im, stride_in, QMODE: tl.constexpr, GROUP: tl.constexpr,
                   UPCAST: tl.constexpr, PRECISION: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One program: SiLU(x W_gate.T) * (x W_up.T) of BLOCK_N intermediate columns for one block of slots."""
    pid_m = tl.program_id(0)
    if pid_m * BLOCK_M >= tl.load(Used):
        return
    expert = tl.load(BlockExpert + pid_m).to(tl.int64)
    slot = tl.load(Slots + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = slot < num_slots
    token = tl.where(valid, slot // top_k, 0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_g = tl.minimum(cols, N - 1).to(tl.int64)  # clamped: columns past N are computed, never stored
    w_e, s_e, z_e = W + expert * stride_we, S + expert * stride_se, Z + expert * stride_ze  # the block's expert
    offs_k = tl.arange(0, BLOCK_K)
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + offs_k
        a = tl.load(X + token[:, None] * stride_xm + ks[None, :] * stride_xk, mask=ks[None, :] < K, other=0.0)
        wg = expert_tile(w_e, s_e, z_e, rows_g, k0, K, Kp, stride_wn, stride_wk, stride_sn, QMODE, GROUP,
                         BLOCK_N, BLOCK_K)
        wu = expert_tile(w_e, s_e, z_e, rows_g + N, k0, K, Kp, stride_wn, stride_wk, stride_sn, QMODE, GROUP,
                         BLOCK_N, BLOCK_K)
        acc_g = dot_tile(a, wg, acc_g, UPCAST, PRECISION)
        acc_u = dot_tile(a, wu, acc_u, UPCAST, PRECISION)
    acc_g = channel_scale(acc_g, s_e, z_e, rows_g, QMODE)
    acc_u = channel_scale(acc_u, s_e, z_e, rows_g + N, QMODE)
    h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    i_ptrs = Inter + slot.to(tl.int64)[:, None] * stride_im + cols[None, :] * stride_in
    tl.store(i_ptrs, cast_out(h, Inter.dtype.element_ty, UPCAST), mask=valid[:, None] & (cols[None, :] < N))


@triton.jit
def down_kernel(Inter, W, S, Z, Part, Slots, BlockExpert, Used, Weights, N, K, Np, num_slots,
                stride_im, stride_in, stride_de, stride_dh, stride_dr, stride_se, stride_sn, stride_ze,
                stride_pm, stride_pk, QMODE: tl.constexpr, GROUP: tl.constexpr,
                UPCAST: tl.constexpr, PRECISION: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One program: BLOCK_N hidden columns of routing weight x (intermediate @ W_down.T) for one block of slots,
    in fp32; BLOCK_K steps along the intermediate size N (Np: N as packed)."""
    pid_m = tl.program_id(0)
    if pid_m * BLOCK_M >= tl.load(Used):
        return
    expert = tl.load(BlockExpert + pid_m).to(tl.int64)
    slot = tl.load(Slots + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = slot < num_slots
    row = tl.where(valid, slot, 0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    w_rows = tl.minimum(cols, K - 1).to(tl.int64)
    # w_down [E, K, N]: strides of the expert, the hidden row, the reduction
    w_e, s_e, z_e = W + expert * stride_de, S + expert * stride_se, Z + expert * stride_ze
    offs_n = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for n0 in range(0, N, BLOCK_K):
        ns = n0 + offs_n
        a = tl.load(Inter + row[:, None] * stride_im + ns[None, :] * stride_in, mask=ns[None, :] < N, other=0.0)
        w = expert_tile(w_e, s_e, z_e, w_rows, n0, N, Np, stride_dh, stride_dr, stride_sn, QMODE, GROUP,
                        BLOCK_N, BLOCK_K)
        acc = dot_tile(a, w, acc, UPCAST, PRECISION)
    acc = channel_scale(acc, s_e, z_e, w_rows, QMODE) * tl.load(Weights + row)[:, None]
    p_ptrs = Part + row[:, None] * stride_pm + cols[None, :] * stride_pk
    tl.store(p_ptrs, acc, mask=valid[:, None] & (cols[None, :] < K))


# Autotune lists for Hopper: never run on a GPU here (lowered offline for sm_90), a starting point. BLOCK_M is not
# tuned: the slots are aligned to it before the launch (choose_block_m). gate_up stages two weight tiles (gate and up)
# per K step, so its widest tile keeps 2 stages: with 3 it needs 240 KiB of shared memory at 64 rows.
TILES = [(64, 64, 4, 4), (128, 64, 4, 3), (64, 128, 4, 3), (128, 128, 8, 3), (32, 128, 4, 4)]
DOWN_CONFIGS = [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=s) for bn, bk, w, s in TILES]
GATE_UP_CONFIGS = [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=2 if bn == bk == 128 else s)
                   for bn, bk, w, s in TILES]
gate_up_tuned = triton.autotune(GATE_UP_CONFIGS, key=["N", "K", "BLOCK_M", "QMODE"])(gate_up_kernel)
down_tuned = triton.autotune(DOWN_CONFIGS, key=["N", "K", "BLOCK_M", "QMODE"])(down_kernel)
# The interpreter's cost is per tile step: large fixed tiles keep host runs short (tests force small ones).
INTERPRETER_TILES = {"BLOCK_N": 128, "BLOCK_K": 256}


def choose_block_m(m: int, top_k: int, experts: int) -> int:
    """Rows per block: the slots an expert gets on average, as a power of two in MIN_BLOCK..MAX_BLOCK_M (a decode
    batch wastes most of a 16-row block, as vLLM's smallest config does)."""
    return min(MAX_BLOCK_M, max(MIN_BLOCK, triton.next_power_of_2(-(-m * top_k // experts))))


def _launch(kernel, tuned, grid_rows: int, cols: int, args: tuple, options: dict, tiles: dict | None) -> None:
    tiles = tiles or (INTERPRETER_TILES if interpreted() else None)
    if tiles is not None:
        kernel[(grid_rows, triton.cdiv(cols, tiles["BLOCK_N"]))](*args, **options, **tiles)
    else:
        tuned[lambda meta: (grid_rows, triton.cdiv(cols, meta["BLOCK_N"]))](*args, **options)


def _run(req: MoeRequest, block_m: int, tiles: dict | None = None) -> torch.Tensor:
    blocks: Blocks = align_blocks(req.topk_ids, req.experts, block_m)
    device = req.x.device
    inter = buffers.empty((req.slots, req.n), dtype=req.dtype, device=device)
    part = buffers.empty((req.slots, req.k), dtype=torch.float32, device=device)
    options = dict(UPCAST=interpreted(), PRECISION="ieee" if req.dtype == torch.float32 else None, BLOCK_M=block_m)
    (wgu, sgu, zgu, kp, *gu_strides), gu_modes = expert_operands(req.w_gate_up, req.k)
    (wd, sd, zd, np_, *d_strides), d_modes = expert_operands(req.w_down, req.n)
    _launch(gate_up_kernel, gate_up_tuned, blocks.blocks, req.n,
            (req.x, wgu, sgu, zgu, inter, blocks.slots, blocks.block_expert, blocks.used, req.n, req.k, kp, req.top_k,
             req.slots, *req.x.stride(), *gu_strides, *inter.stride()), {**options, **gu_modes}, tiles)
    _launch(down_kernel, down_tuned, blocks.blocks, req.k,
            (inter, wd, sd, zd, part, blocks.slots, blocks.block_expert, blocks.used, req.topk_weights, req.n, req.k,
             np_, req.slots, *inter.stride(), *d_strides, *part.stride()), {**options, **d_modes}, tiles)
    return part.view(req.m, req.top_k, req.k).sum(dim=1).to(req.dtype)


def triton_moe(x, w_gate_up, w_down, topk_weights, topk_ids, *, block_m: int | None = None,
               tiles: dict | None = None) -> torch.Tensor:
    """The fused kernels with the rows per block (a power of two >= 16) or the tiles (BLOCK_N, BLOCK_K) forced, as
    the tests do to reach the edges."""
    req = validate_moe(x, w_gate_up, w_down, topk_weights, topk_ids)
    TRITON_MOE.check(req)
    refuse_e4m3(req.scheme, req.x.device)
    if block_m is None:
        block_m = choose_block_m(req.m, req.top_k, req.experts)
    elif isinstance(block_m, bool) or not isinstance(block_m, int) or block_m < MIN_BLOCK or block_m & (block_m - 1):
        raise ValueError(f"block_m: must be a power of two >= {MIN_BLOCK}, got {block_m!r}")
    return _run(req, block_m, tiles)


def _plan(req: MoeRequest) -> PlannedCall:
    refuse_e4m3(req.scheme, req.x.device)
    block_m = choose_block_m(req.m, req.top_k, req.experts)
    return PlannedCall("triton", f"{BACKEND}:{mode()}", lambda: _run(req, block_m))


TRITON_MOE = add_builtin(Impl(
    name="triton",
    summary="phasebench's fused Triton MoE: align slots into per-expert blocks, gate/up + SiLU kernel, down kernel",
    devices=frozenset({"cpu", "cuda"}),
    dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32}),
    plan=_plan,
    unavailable=why_unavailable,
    compute=compute,
    backends=lambda device_type: f"{BACKEND} ({mode()})",
    op="moe",
))
