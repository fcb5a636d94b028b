"""Tiled online-softmax attention in Triton for prefill and chunked prefill (FlashAttention-2 style).

One program owns BLOCK_M query rows of one (batch, q head) and walks the key blocks: first the
blocks every row sees in full (no mask arithmetic), then the blocks on the causal diagonal or
the ragged end (masked). Blocks past the bottom-right diagonal are never visited. GQA reads
the shared KV head through its index; K/V are never copied. Head dims pad to a power of two.
A sliding window (window_left, FlashInfer's) starts the walk at the first block any row's window reaches and masks
the blocks across its left edge; the blocks before it are never visited. A sink logit (gpt-oss) joins the
denominator in the final normalisation only.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..triton_cast import cast_out
from ..triton_mode import interpreted
from .paged import bhsd_strides
from .triton_decode import LOG2E, LOG2E_IN_KERNEL, page_offsets, sink_normalised


@triton.jit
def _tile(acc, l_i, m_i, q, k_ptrs, v_ptrs, table_row, start_n, offs_m, offs_n, offs_d, kv_limit, diag, window, D,
          stride_kp, stride_kn, stride_vp, stride_vn, qk_scale,
          MASKED: tl.constexpr, CAUSAL: tl.constexpr, EVEN_D: tl.constexpr, UPCAST: tl.constexpr,
          PRECISION: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HAS_WINDOW: tl.constexpr):
    keys = start_n + offs_n
    # the step from the head's base to this block's keys: a scalar for a contiguous cache, offsets through the
    # table for a paged one (each pointer tile is formed at its load: forming both first cost spills at D256)
    if PAGE_SIZE > 0:
        k_off, v_off = page_offsets(table_row, start_n, offs_n, kv_limit, stride_kp, stride_kn, stride_vp, stride_vn,
                                    PAGE_SIZE, BLOCK_N)
        k_step, v_step = k_off[None, :], v_off[:, None]
    else:
        k_step, v_step = start_n * stride_kn, start_n * stride_vn
    if MASKED:
        k = tl.load(k_ptrs + k_step, mask=(keys[None, :] < kv_limit) & (offs_d[:, None] < D), other=0.0)
        v = tl.load(v_ptrs + v_step, mask=(keys[:, None] < kv_limit) & (offs_d[None, :] < D), other=0.0)
    elif EVEN_D:
        k = tl.load(k_ptrs + k_step)
        v = tl.load(v_ptrs + v_step)
    else:
        k = tl.load(k_ptrs + k_step, mask=offs_d[:, None] < D, other=0.0)
        v = tl.load(v_ptrs + v_step, mask=offs_d[None, :] < D, other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    s = tl.dot(q, k, input_precision=PRECISION) * qk_scale
    if MASKED:
        valid = keys[None, :] < kv_limit
        if CAUSAL:
            valid = valid & (keys[None, :] <= diag + offs_m[:, None])
        if HAS_WINDOW:  # query row m sits at position diag + m and sees keys from diag + m - window on
            valid = valid & (keys[None, :] >= diag + offs_m[:, None] - window)
        s = tl.where(valid, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no key yet stay at zero
    alpha = tl.math.exp2(m_i - m_safe)
    p = tl.math.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, l_i, m_new


@triton.jit
def prefill_kernel(Q, K, V, Out, SEQLENS, TABLE, SINKS, qk_scale,
                   stride_qb, stride_qh, stride_qm, stride_qd,
                   stride_kb, stride_kh, stride_kn, stride_kd,
                   stride_vb, stride_vh, stride_vn, stride_vd,
                   stride_ob, stride_oh, stride_om, stride_od, stride_tb,
                   q_heads, group, q_len, kv_len, D, window,
                   HAS_SEQLENS: tl.constexpr, CAUSAL: tl.constexpr, UPCAST: tl.constexpr,
                   PRECISION: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
                   HAS_WINDOW: tl.constexpr, HAS_SINKS: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    # int64 offsets: batch x stride passes 2**31 elements in large decode and prefill batches
    b = (pid_bh // q_heads).to(tl.int64)
    h = (pid_bh % q_heads).to(tl.int64)
    kv_h = h // group
    if HAS_SEQLENS:
        kv_limit = tl.load(SEQLENS + b)
    else:
        kv_limit = kv_len
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)

    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < q_len) & (offs_d[None, :] < D), other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    if PAGE_SIZE > 0:  # pools [num_pages, PAGE_SIZE, Hkv, D]: page stride stride_kb, slot stride stride_kn
        k_ptrs = K + kv_h * stride_kh + offs_d[:, None] * stride_kd
        v_ptrs = V + kv_h * stride_vh + offs_d[None, :] * stride_vd
        table_row = TABLE + b * stride_tb
    else:
        k_ptrs = K + b * stride_kb + kv_h * stride_kh + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd
        v_ptrs = V + b * stride_vb + kv_h * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd
        table_row = TABLE

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # bottom-right causal: query i sees keys j <= diag + i, with diag = L - Sq
    diag = kv_limit - q_len
    if CAUSAL:
        hi = tl.minimum(kv_limit, diag + start_m + BLOCK_M)
        seen_by_all = tl.minimum(kv_limit, diag + start_m + 1)
    else:
        hi = kv_limit
        seen_by_all = kv_limit
    full_end = (seen_by_all // BLOCK_N) * BLOCK_N
    if HAS_WINDOW:
        # the first block any row's window reaches, and the first that every row's window holds whole
        lo = (tl.maximum(diag + start_m - window, 0) // BLOCK_N) * BLOCK_N
        last_row = tl.minimum(start_m + BLOCK_M, q_len) - 1
        inside = tl.minimum(tl.cdiv(tl.maximum(diag + last_row - window, 0), BLOCK_N) * BLOCK_N, hi)
        for start_n in range(lo, inside, BLOCK_N):  # across the window's left edge: masked
            acc, l_i, m_i = _tile(acc, l_i, m_i, q, k_ptrs, v_ptrs, table_row, start_n, offs_m, offs_n, offs_d,
                                  kv_limit, diag, window, D, stride_kb, stride_kn, stride_vb, stride_vn, qk_scale, True,
                                  CAUSAL, EVEN_D, UPCAST, PRECISION, PAGE_SIZE, BLOCK_N, HAS_WINDOW)
        lo = tl.maximum(lo, inside)
        full_end = tl.maximum(full_end, lo)
    else:
        lo = 0
    for start_n in range(lo, full_end, BLOCK_N):
        acc, l_i, m_i = _tile(acc, l_i, m_i, q, k_ptrs, v_ptrs, table_row, start_n, offs_m, offs_n, offs_d, kv_limit,
                              diag, window, D, stride_kb, stride_kn, stride_vb, stride_vn, qk_scale, False, CAUSAL,
                              EVEN_D, UPCAST, PRECISION, PAGE_SIZE, BLOCK_N, HAS_WINDOW)
    for start_n in range(full_end, hi, BLOCK_N):
        acc, l_i, m_i = _tile(acc, l_i, m_i, q, k_ptrs, v_ptrs, table_row, start_n, offs_m, offs_n, offs_d, kv_limit,
                              diag, window, D, stride_kb, stride_kn, stride_vb, stride_vn, qk_scale, True, CAUSAL,
                              EVEN_D, UPCAST, PRECISION, PAGE_SIZE, BLOCK_N, HAS_WINDOW)

    if HAS_SINKS:  # the head's sink logit (in base 2 like the scores) joins the denominator, and only it
        acc, l_i = sink_normalised(acc, l_i, m_i, tl.load(SINKS + h) * LOG2E_IN_KERNEL)
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # a padding row past q_len may see no key in a window
    o_ptrs = Out + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
    tl.store(o_ptrs, cast_out(out, Out.dtype.element_ty, UPCAST),
             mask=(offs_m[:, None] < q_len) & (offs_d[None, :] < D))


def _prune(configs, named_args, **kwargs):
    """Drop tiles whose working set cannot fit in shared memory for large head dims."""
    block_d = named_args.get("BLOCK_D", kwargs.get("BLOCK_D", 128))
    kept = [c for c in configs if block_d < 256 or (c.kwargs["BLOCK_M"] <= 64 and c.kwargs["BLOCK_N"] <= 64)]
    return kept or configs[:1]


TUNING_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
    for bm, bn, w, s in [
        # sm_90 builds (bench/session/hopper_build.py): 4-warp M128 N64, M128 N32 and M64 N128 spilled at D128, and
        # 4-warp M64 N64 at D256, so those tiles take 8 warps
        (128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 8, 4), (128, 32, 8, 3),
        (64, 64, 8, 3), (64, 32, 8, 3), (64, 32, 4, 4),
    ]
]

prefill_kernel_tuned = triton.autotune(
    TUNING_CONFIGS, key=["q_len", "kv_len", "BLOCK_D", "CAUSAL", "HAS_SEQLENS", "PAGE_SIZE", "HAS_WINDOW"],
    prune_configs_by={"early_config_prune": _prune},
)(prefill_kernel)

# The interpreter runs each program in Python: one fixed, moderate tile keeps tests quick.
INTERPRETER_CONFIG = {"BLOCK_M": 64, "BLOCK_N": 64}


def launch_prefill(req, out, block_d: int, upcast: bool, precision: str) -> None:
    """Launch the prefill kernel for a validated request, writing into `out` (BHSD)."""
    q, k, v = req.q, req.k, req.v
    seqlens = req.cache_seqlens if req.cache_seqlens is not None else q  # dummy pointers when unused
    table = req.block_table if req.paged else seqlens
    sinks = req.sinks if req.sinks is not None else seqlens
    args = (q, k, v, out, seqlens, table, sinks, req.scale * LOG2E,
            *q.stride(), *bhsd_strides(k, req.paged), *bhsd_strides(v, req.paged), *out.stride(), table.stride(0),
            req.q_heads, req.q_heads // req.kv_heads, req.q_len, req.kv_len, req.head_dim, max(req.window_left, 0))
    flags = dict(HAS_SEQLENS=req.cache_seqlens is not None, CAUSAL=req.causal, UPCAST=upcast,
                 PRECISION=precision, BLOCK_D=block_d, EVEN_D=block_d == req.head_dim, PAGE_SIZE=req.page_size,
                 HAS_WINDOW=req.windowed, HAS_SINKS=req.sinks is not None)
    if interpreted():
        grid = (triton.cdiv(req.q_len, INTERPRETER_CONFIG["BLOCK_M"]), req.batch * req.q_heads)
        prefill_kernel[grid](*args, **flags, **INTERPRETER_CONFIG)
    else:
        def grid(meta):
            return (triton.cdiv(req.q_len, meta["BLOCK_M"]), req.batch * req.q_heads)
        prefill_kernel_tuned[grid](*args, **flags)
