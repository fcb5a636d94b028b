"""Split-KV decode attention in Triton (Flash-Decoding), for one to a few query tokens.

Stage 1: the KV length of each sequence is cut into `num_splits` chunks; one program owns one
chunk of one (batch, kv head) and all the query rows that read that KV head (GQA group x q_len),
so K/V are read once per kv head. It writes its partial max, sum and unnormalised output.
Stage 2: a reduce kernel rescales and sums the partials of each query row.
A paged cache (PAGE_SIZE > 0) is read through the block table: K/V are pools [num_pages, page_size, Hkv, D], and
each block of BLOCK_N keys finds its page (one table entry per block when pages hold whole blocks, else one per key).
An fp8 cache (KV_FP8) arrives as its bytes, each block bitcast to e4m3 and converted in the loop; the per-tensor or
per-head scales are folded into the score scale (K) and the partial output (V), constant along a program's keys.
A sliding window cuts the splits from the keys some row's window reaches (from the block holding L - Sq - window on),
so a window layer's step reads a bounded slice of the cache whatever its length; a sink logit joins the denominator
in the reduce kernel only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import buffers
from ..triton_cast import cast_out
from ..triton_mode import interpreted, multiprocessor_count
from .fp8 import codes, scale_stride
from .paged import bhsd_strides

LOG2E = 1.4426950408889634  # kernels work in base 2: exp(x) = exp2(x * log2(e))
LOG2E_IN_KERNEL = tl.constexpr(LOG2E)  # the same, readable inside a kernel (which reads constexpr globals only)
MAX_SPLITS = 128


@triton.jit
def page_offsets(TABLE_ROW, start_n, offs_n, limit, stride_kp, stride_kn, stride_vp, stride_vn,
                 PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    """Offsets in the K and V pools of keys start_n + offs_n of one sequence (TABLE_ROW: its block-table row);
    start_n is a multiple of BLOCK_N. Keys at or past `limit` get page 0 and must be masked by the caller."""
    if PAGE_SIZE % BLOCK_N == 0:  # the block lies in one page: one table entry
        page = tl.load(TABLE_ROW + start_n // PAGE_SIZE).to(tl.int64)
        slot = start_n % PAGE_SIZE + offs_n
    else:  # pages smaller than the block (or not a multiple of it): one entry per key
        keys = start_n + offs_n
        page = tl.load(TABLE_ROW + keys // PAGE_SIZE, mask=keys < limit, other=0).to(tl.int64)
        slot = keys % PAGE_SIZE
    return page * stride_kp + slot * stride_kn, page * stride_vp + slot * stride_vn


@triton.jit
def fp8_codes_to(codes, dtype: tl.constexpr):
    """e4m3 (fn) codes loaded as uint8 (a masked load cannot fill fp8), bitcast and converted to `dtype`: exact in
    fp16, bf16 and fp32, which hold every e4m3 value."""
    return codes.to(tl.float8e4nv, bitcast=True).to(dtype)


@triton.jit
def sink_normalised(acc, l_i, m_i, sink):
    """acc [R, D] and l_i [R], relative to the running max m_i (base 2), rescaled to max(m_i, sink) with exp2 of the
    sink (base 2 too) added to l_i; a row with no key (m_i = -inf) keeps acc 0 and gets l_i 1."""
    top = tl.maximum(m_i, sink)
    alpha = tl.math.exp2(m_i - top)
    return acc * alpha[:, None], l_i * alpha + tl.math.exp2(sink - top)


@triton.jit
def split_kv_kernel(Q, K, V, SEQLENS, TABLE, K_SCALE, V_SCALE, PART_M, PART_L, PART_ACC, qk_scale,
                    stride_qb, stride_qh, stride_qm, stride_qd,
                    stride_kb, stride_kh, stride_kn, stride_kd,
                    stride_vb, stride_vh, stride_vn, stride_vd, stride_tb,
                    q_heads, kv_heads, group, q_len, kv_len, D, num_splits, window, stride_ks, stride_vs,
                    HAS_SEQLENS: tl.constexpr, CAUSAL: tl.constexpr, UPCAST: tl.constexpr,
                    PRECISION: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_ROWS: tl.constexpr,
                    BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr, HAS_WINDOW: tl.constexpr,
                    KV_FP8: tl.constexpr = False):
    # PAGE_SIZE 0: K/V are [B, Hkv, Sk, D]; else pools [num_pages, PAGE_SIZE, Hkv, D] whose page stride is stride_kb
    # and slot stride stride_kn, read through TABLE [B, max_pages]
    split = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // kv_heads).to(tl.int64)  # int64 offsets: batch x stride can pass 2**31 elements
    kv_h = (pid_bh % kv_heads).to(tl.int64)
    if HAS_SEQLENS:
        kv_limit = tl.load(SEQLENS + b)
    else:
        kv_limit = kv_len
    # this program's chunk of keys, a whole number of blocks from the first block any row sees (0, or with a window
    # the block of L - Sq - window); trailing chunks may be empty
    if HAS_WINDOW:
        start = (tl.maximum(kv_limit - q_len - window, 0) // BLOCK_N) * BLOCK_N
    else:
        start = 0
    chunk = tl.cdiv(tl.cdiv(kv_limit - start, num_splits), BLOCK_N) * BLOCK_N
    lo = start + split * chunk
    hi = tl.minimum(lo + chunk, kv_limit)

    rows = tl.arange(0, BLOCK_ROWS)  # row r is query token r % q_len of head kv_h * group + r // q_len
    g = rows // q_len
    tok = rows % q_len
    h = kv_h * group + g
    row_ok = rows < group * q_len
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)

    q_ptrs = Q + b * stride_qb + h[:, None] * stride_qh + tok[:, None] * stride_qm + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=row_ok[:, None] & (offs_d[None, :] < D), other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    if KV_FP8:  # value = code x scale: K's scale joins the scores' scale, V's the output's (one per head or tensor)
        qk_scale = qk_scale * tl.load(K_SCALE + kv_h * stride_ks)
        v_scale = tl.load(V_SCALE + kv_h * stride_vs)
    else:
        v_scale = 1.0
    if PAGE_SIZE > 0:
        k_ptrs = K + kv_h * stride_kh + offs_d[:, None] * stride_kd  # [BLOCK_D, 1], the keys' offsets added per block
        v_ptrs = V + kv_h * stride_vh + offs_d[None, :] * stride_vd
    else:
        k_ptrs = K + b * stride_kb + kv_h * stride_kh + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd
        v_ptrs = V + b * stride_vb + kv_h * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd

    m_i = tl.full([BLOCK_ROWS], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_ROWS], dtype=tl.float32)
    acc = tl.zeros([BLOCK_ROWS, BLOCK_D], dtype=tl.float32)
    last_key = kv_limit - q_len + tok  # bottom-right causal bound per row
    for start_n in range(lo, hi, BLOCK_N):
        keys = start_n + offs_n
        if PAGE_SIZE > 0:  # offsets through the table; a scalar step for a contiguous cache
            k_off, v_off = page_offsets(TABLE + b * stride_tb, start_n, offs_n, hi, stride_kb, stride_kn,
                                        stride_vb, stride_vn, PAGE_SIZE, BLOCK_N)
            k_step, v_step = k_off[None, :], v_off[:, None]
        else:
            k_step, v_step = start_n * stride_kn, start_n * stride_vn
        k = tl.load(k_ptrs + k_step, mask=(keys[None, :] < hi) & (offs_d[:, None] < D), other=0.0)
        v = tl.load(v_ptrs + v_step, mask=(keys[:, None] < hi) & (offs_d[None, :] < D), other=0.0)
        if KV_FP8:  # the codes' bytes as e4m3, converted exactly to q's dtype (fp32 in the interpreter)
            k = fp8_codes_to(k, q.dtype)
            v = fp8_codes_to(v, q.dtype)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, k, input_precision=PRECISION) * qk_scale
        valid = keys[None, :] < hi
        if CAUSAL:
            valid = valid & (keys[None, :] <= last_key[:, None])
        if HAS_WINDOW:  # the row's position is its last key (bottom-right), causal or not
            valid = valid & (keys[None, :] >= last_key[:, None] - window)
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m_i - m_safe)
        p = tl.math.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    if KV_FP8:
        acc = acc * v_scale
    # partials are [B, Hq, Sq, num_splits] (+ [D] for the accumulator), contiguous fp32
    part = ((b * q_heads + h) * q_len + tok) * num_splits + split
    tl.store(PART_M + part, m_i, mask=row_ok)
    tl.store(PART_L + part, l_i, mask=row_ok)
    tl.store(PART_ACC + part[:, None] * D + offs_d[None, :], acc, mask=row_ok[:, None] & (offs_d[None, :] < D))


@triton.jit
def reduce_kernel(PART_M, PART_L, PART_ACC, Out, SINKS, stride_ob, stride_oh, stride_om, stride_od,
                  q_heads, q_len, D, num_splits, UPCAST: tl.constexpr, BLOCK_S: tl.constexpr,
                  BLOCK_D: tl.constexpr, HAS_SINKS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # flat (b, h, token)
    tok = row % q_len
    h = (row // q_len) % q_heads
    b = row // (q_len * q_heads)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_ok = offs_s < num_splits
    m = tl.load(PART_M + row * num_splits + offs_s, mask=s_ok, other=float("-inf"))
    lsum = tl.load(PART_L + row * num_splits + offs_s, mask=s_ok, other=0.0)
    acc = tl.load(PART_ACC + (row * num_splits + offs_s)[:, None] * D + offs_d[None, :],
                  mask=s_ok[:, None] & (offs_d[None, :] < D), other=0.0)
    m_max = tl.max(m, 0)
    if HAS_SINKS:  # the head's sink logit, in base 2 like the partial maxima, joins the denominator
        sink = tl.load(SINKS + h) * LOG2E_IN_KERNEL
        top = tl.maximum(m_max, sink)
        w = tl.where(m == float("-inf"), 0.0, tl.math.exp2(m - top))  # empty splits weigh nothing
        denominator = tl.sum(lsum * w, 0) + tl.math.exp2(sink - top)
    else:
        w = tl.where(m == float("-inf"), 0.0, tl.math.exp2(m - m_max))
        denominator = tl.sum(lsum * w, 0)
    out = tl.sum(acc * w[:, None], 0) / denominator
    o_ptrs = Out + b * stride_ob + h * stride_oh + tok * stride_om + offs_d * stride_od
    tl.store(o_ptrs, cast_out(out, Out.dtype.element_ty, UPCAST), mask=offs_d < D)


TUNING_CONFIGS = [
    triton.Config({"BLOCK_N": bn}, num_warps=w, num_stages=s)
    # 4-warp N128 spilled at D256 and at 128 verify rows on sm_90; 8-warp N64 is clean for both
    for bn, w, s in [(64, 4, 2), (64, 4, 3), (64, 8, 2), (128, 8, 3), (32, 4, 3), (256, 8, 2)]
]

split_kv_kernel_tuned = triton.autotune(
    TUNING_CONFIGS, key=["kv_len", "group", "q_len", "num_splits", "BLOCK_D", "HAS_SEQLENS", "PAGE_SIZE",
                         "HAS_WINDOW", "KV_FP8"],
)(split_kv_kernel)

INTERPRETER_BLOCK_N = 64
SPLIT_BLOCK = 64  # granularity used to bound the split count by the number of key blocks


def choose_splits(batch: int, kv_heads: int, kv_len: int, multiprocessors: int) -> int:
    """Enough chunks for about two programs per multiprocessor, never more than the key blocks."""
    programs = batch * kv_heads
    wanted = triton.cdiv(2 * multiprocessors, programs)
    blocks = triton.cdiv(kv_len, SPLIT_BLOCK)
    return max(1, min(wanted, blocks, MAX_SPLITS))


def launch_split_kv(req, out, block_d: int, upcast: bool, precision: str, num_splits: int | None) -> int:
    """Launch both stages for a validated request, writing into `out`; returns the split count used."""
    q, k, v = req.q, req.k, req.v
    if num_splits is None:  # a window reads at most its span and the queries' own keys
        keys = min(req.kv_len, req.window_left + req.q_len) if req.windowed else req.kv_len
        num_splits = choose_splits(req.batch, req.kv_heads, keys, multiprocessor_count(q.device))
    if not isinstance(num_splits, int) or num_splits < 1:
        raise ValueError(f"num_splits: must be a positive int, got {num_splits!r}")
    group = req.q_heads // req.kv_heads
    rows = group * req.q_len
    part_shape = (req.batch, req.q_heads, req.q_len, num_splits)
    part_m = buffers.empty(part_shape, device=q.device, dtype=torch.float32)
    part_l = buffers.empty(part_shape, device=q.device, dtype=torch.float32)
    part_acc = buffers.empty((*part_shape, req.head_dim), device=q.device, dtype=torch.float32)
    seqlens = req.cache_seqlens if req.cache_seqlens is not None else q
    table = req.block_table if req.paged else seqlens  # dummy pointers when unused
    k_scale, v_scale = (req.k_scale, req.v_scale) if req.kv_fp8 else (part_m, part_m)
    args = (q, codes(k), codes(v), seqlens, table, k_scale, v_scale, part_m, part_l, part_acc, req.scale * LOG2E,
            *q.stride(), *bhsd_strides(k, req.paged), *bhsd_strides(v, req.paged), table.stride(0),
            req.q_heads, req.kv_heads, group, req.q_len, req.kv_len, req.head_dim, num_splits, max(req.window_left, 0),
            *((scale_stride(req.k_scale), scale_stride(req.v_scale)) if req.kv_fp8 else (0, 0)))
    flags = dict(HAS_SEQLENS=req.cache_seqlens is not None, CAUSAL=req.causal and req.q_len > 1,
                 UPCAST=upcast, PRECISION=precision, BLOCK_D=block_d,
                 BLOCK_ROWS=max(16, triton.next_power_of_2(rows)), PAGE_SIZE=req.page_size, HAS_WINDOW=req.windowed,
                 KV_FP8=req.kv_fp8)
    grid = (num_splits, req.batch * req.kv_heads)
    if interpreted():
        split_kv_kernel[grid](*args, **flags, BLOCK_N=INTERPRETER_BLOCK_N)
    else:
        split_kv_kernel_tuned[grid](*args, **flags)
    reduce_partials(part_m, part_l, part_acc, out, req.sinks, upcast, block_d)
    return num_splits


def reduce_partials(part_m, part_l, part_acc, out, sinks, upcast: bool, block_d: int) -> None:
    """Stage 2: merge the fp32 partials [B, Hq, Sq, splits] (+ [Dv] for the accumulator) into `out` [B, Hq, Sq, Dv],
    a sink logit per head (float32 [Hq]) joining each row's denominator where given."""
    batch, q_heads, q_len, num_splits = part_m.shape
    reduce_kernel[(batch * q_heads * q_len,)](
        part_m, part_l, part_acc, out, sinks if sinks is not None else part_m, *out.stride(), q_heads, q_len,
        out.shape[-1], num_splits, UPCAST=upcast, BLOCK_S=max(2, triton.next_power_of_2(num_splits)),
        BLOCK_D=block_d, HAS_SINKS=sinks is not None)
