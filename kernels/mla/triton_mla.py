"""Split-KV MLA decode in Triton (FlashMLA's and vLLM's split: the latent read once per block of query heads).

Stage 1: each sequence's keys are cut into `num_splits` chunks; one program owns one chunk of one sequence and
BLOCK_ROWS query rows (heads x the Sq <= 2 tokens), and per block of BLOCK_N tokens loads the latent's first Dv dims
once, as the key's compressed part and as the value, and its last Dqk - Dv (rotary) dims as the rest of the key:
s = q_nope . c + q_rope . r, acc += p . c. It writes its partial max, sum and unnormalised output; stage 2 is the
attention decode's reduce kernel (triton_decode.reduce_partials). A paged latent cache is read through the block
table as the attention kernels read theirs (triton_decode.page_offsets). An fp8 latent (KV_FP8) is loaded as its
bytes and converted in the loop, its one scale folded into the score scale and the partial output.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import buffers
from ..attention.fp8 import codes, triton_refusal
from ..attention.paged import bhsd_strides
from ..attention.triton_decode import LOG2E, choose_splits, fp8_codes_to, page_offsets, reduce_partials
from ..errors import Unsupported
from ..registry import Impl, PlannedCall, add_builtin
from ..triton_mode import compute, interpreted, mode, multiprocessor_count, why_unavailable
from .request import MLARequest

MLA_MAX_SPLITS = 32  # the reduce kernel holds [splits, Dv] partials: 32 x 512, the attention decode's 128 x 128
MIN_BLOCK = 16  # tl.dot needs at least 16 along each dimension


@triton.jit
def mla_split_kernel(Q, KV, SEQLENS, TABLE, LATENT_SCALE, PART_M, PART_L, PART_ACC, qk_scale,
                     stride_qb, stride_qh, stride_qm, stride_qd, stride_kb, stride_kn, stride_kd, stride_tb,
                     q_heads, q_len, kv_len, DV, DR, num_splits,
                     HAS_SEQLENS: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
                     BLOCK_DV: tl.constexpr, BLOCK_DR: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
                     PAGE_SIZE: tl.constexpr, KV_FP8: tl.constexpr = False):
    # PAGE_SIZE 0: KV is [B, 1, Sk, Dqk] (stride_kb per sequence); else a pool [num_pages, PAGE_SIZE, 1, Dqk]
    # (stride_kb per page, stride_kn per slot) read through TABLE [B, max_pages]
    split = tl.program_id(0)
    row_blocks = tl.cdiv(q_heads * q_len, BLOCK_ROWS)
    b = (tl.program_id(1) // row_blocks).to(tl.int64)  # int64 offsets: batch x stride can pass 2**31 elements
    rows = (tl.program_id(1) % row_blocks) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)  # row = head * q_len + token
    h = rows // q_len
    tok = rows % q_len
    row_ok = rows < q_heads * q_len
    if HAS_SEQLENS:
        kv_limit = tl.load(SEQLENS + b)
    else:
        kv_limit = kv_len
    chunk = tl.cdiv(tl.cdiv(kv_limit, num_splits), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, kv_limit)

    offs_v = tl.arange(0, BLOCK_DV)
    offs_r = tl.arange(0, BLOCK_DR)
    offs_n = tl.arange(0, BLOCK_N)
    q_row = Q + b * stride_qb + h[:, None] * stride_qh + tok[:, None] * stride_qm
    q_nope = tl.load(q_row + offs_v[None, :] * stride_qd, mask=row_ok[:, None] & (offs_v[None, :] < DV), other=0.0)
    q_rope = tl.load(q_row + (DV + offs_r[None, :]) * stride_qd, mask=row_ok[:, None] & (offs_r[None, :] < DR),
                     other=0.0)
    if UPCAST:
        q_nope = q_nope.to(tl.float32)
        q_rope = q_rope.to(tl.float32)
    if KV_FP8:  # value = code x scale: the one scale joins the scores' scale and the output's
        latent_scale = tl.load(LATENT_SCALE)
        qk_scale = qk_scale * latent_scale
    if PAGE_SIZE > 0:
        base = KV
    else:
        base = KV + b * stride_kb

    m_i = tl.full([BLOCK_ROWS], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_ROWS], dtype=tl.float32)
    acc = tl.zeros([BLOCK_ROWS, BLOCK_DV], dtype=tl.float32)
    last_key = kv_limit - q_len + tok  # bottom-right causal: the draft token before the last sees one key fewer
    for start_n in range(lo, hi, BLOCK_N):
        keys = start_n + offs_n
        if PAGE_SIZE > 0:
            key_off, _ = page_offsets(TABLE + b * stride_tb, start_n, offs_n, hi, stride_kb, stride_kn, stride_kb,
                                      stride_kn, PAGE_SIZE, BLOCK_N)
        else:
            key_off = keys.to(tl.int64) * stride_kn
        in_chunk = keys < hi
        c = tl.load(base + key_off[:, None] + offs_v[None, :] * stride_kd,
                    mask=in_chunk[:, None] & (offs_v[None, :] < DV), other=0.0)  # [N, Dv]: key part and value
        r = tl.load(base + key_off[:, None] + (DV + offs_r[None, :]) * stride_kd,
                    mask=in_chunk[:, None] & (offs_r[None, :] < DR), other=0.0)  # [N, Dr]: the rotary key part
        if KV_FP8:  # the codes' bytes as e4m3, converted exactly to q's dtype (fp32 in the interpreter)
            c = fp8_codes_to(c, q_nope.dtype)
            r = fp8_codes_to(r, q_nope.dtype)
        if UPCAST:
            c = c.to(tl.float32)
            r = r.to(tl.float32)
        s = tl.dot(q_nope, tl.trans(c), input_precision=PRECISION)
        s = (s + tl.dot(q_rope, tl.trans(r), input_precision=PRECISION)) * qk_scale
        s = tl.where(in_chunk[None, :] & (keys[None, :] <= last_key[:, None]), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m_i - m_safe)
        p = tl.math.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(c.dtype), c, input_precision=PRECISION)
        m_i = m_new

    if KV_FP8:
        acc = acc * latent_scale
    part = ((b * q_heads + h) * q_len + tok) * num_splits + split  # partials [B, Hq, Sq, splits] (+ [Dv])
    tl.store(PART_M + part, m_i, mask=row_ok)
    tl.store(PART_L + part, l_i, mask=row_ok)
    tl.store(PART_ACC + part[:, None] * DV + offs_v[None, :], acc, mask=row_ok[:, None] & (offs_v[None, :] < DV))


TUNING_CONFIGS = [
    triton.Config({"BLOCK_ROWS": rows, "BLOCK_N": bn}, num_warps=w, num_stages=s)
    for rows, bn, w, s in [(16, 16, 4, 2), (16, 32, 4, 2), (16, 32, 8, 2), (32, 16, 8, 2), (32, 32, 8, 2)]
]

mla_split_kernel_tuned = triton.autotune(
    TUNING_CONFIGS, key=["kv_len", "q_heads", "q_len", "num_splits", "BLOCK_DV", "HAS_SEQLENS", "PAGE_SIZE",
                         "KV_FP8"],
)(mla_split_kernel)

INTERPRETER_CONFIG = {"BLOCK_ROWS": 16, "BLOCK_N": 16}
NOMINAL_ROWS = 16  # the row block the split count is chosen for (the smallest tuned one)


def mla_splits(req: MLARequest, multiprocessors: int) -> int:
    """Splits for about two programs per multiprocessor, never more than the key blocks or MLA_MAX_SPLITS."""
    row_blocks = triton.cdiv(req.q_heads * req.q_len, NOMINAL_ROWS)
    return min(MLA_MAX_SPLITS, choose_splits(req.batch, row_blocks, req.kv_len, multiprocessors))


def mla_decode_triton(req: MLARequest, num_splits: int | None = None) -> torch.Tensor:
    """Both stages for a validated request: out [B, Hq, Sq, v_dim] in q's dtype."""
    q, kv = req.q, req.latent
    if num_splits is None:
        num_splits = mla_splits(req, multiprocessor_count(q.device))
    if not isinstance(num_splits, int) or num_splits < 1:
        raise ValueError(f"num_splits: must be a positive int, got {num_splits!r}")
    dv, dr = req.v_dim, req.head_dim - req.v_dim
    out = buffers.empty((req.batch, req.q_heads, req.q_len, dv), device=q.device, dtype=q.dtype)
    part_shape = (req.batch, req.q_heads, req.q_len, num_splits)
    part_m = buffers.empty(part_shape, device=q.device, dtype=torch.float32)
    part_l = buffers.empty(part_shape, device=q.device, dtype=torch.float32)
    part_acc = buffers.empty((*part_shape, dv), device=q.device, dtype=torch.float32)
    seqlens = req.cache_seqlens if req.cache_seqlens is not None else q  # dummy pointers when unused
    table = req.block_table if req.paged else seqlens
    seq_stride, _, key_stride, dim_stride = bhsd_strides(kv, req.paged)
    upcast = interpreted()  # the interpreter has no bf16/fp16 arithmetic
    block_dv = max(MIN_BLOCK, triton.next_power_of_2(dv))
    latent_scale = req.latent_scale if req.kv_fp8 else part_m  # a dummy pointer when unused
    args = (q, codes(kv), seqlens, table, latent_scale, part_m, part_l, part_acc, req.scale * LOG2E, *q.stride(),
            seq_stride, key_stride, dim_stride, table.stride(0), req.q_heads, req.q_len, req.kv_len, dv, dr, num_splits)
    flags = dict(HAS_SEQLENS=req.cache_seqlens is not None, UPCAST=upcast,
                 PRECISION="ieee" if req.dtype == torch.float32 else "tf32", BLOCK_DV=block_dv,
                 BLOCK_DR=max(MIN_BLOCK, triton.next_power_of_2(dr)), PAGE_SIZE=req.page_size, KV_FP8=req.kv_fp8)
    rows = req.q_heads * req.q_len
    if interpreted():
        grid = (num_splits, req.batch * triton.cdiv(rows, INTERPRETER_CONFIG["BLOCK_ROWS"]))
        mla_split_kernel[grid](*args, **flags, **INTERPRETER_CONFIG)
    else:
        def grid(meta):
            return (num_splits, req.batch * triton.cdiv(rows, meta["BLOCK_ROWS"]))
        mla_split_kernel_tuned[grid](*args, **flags)
    reduce_partials(part_m, part_l, part_acc, out, None, upcast, block_dv)
    return out


def _plan(req: MLARequest) -> PlannedCall:
    if req.kv_fp8 and (why := triton_refusal(req.q.device)):
        raise Unsupported(why)
    suffix = ("+paged" if req.paged else "") + ("+fp8kv" if req.kv_fp8 else "")
    return PlannedCall("triton", f"triton-mla-splitkv{suffix}:{mode()}",
                       lambda: mla_decode_triton(req))


TRITON_MLA = add_builtin(Impl(
    name="triton",
    summary="phasebench's split-KV MLA decode: the latent read once per block of heads, the attention reduce kernel",
    devices=frozenset({"cpu", "cuda"}),
    dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32}),
    plan=_plan,
    fp8_kv=True,
    unavailable=why_unavailable,
    compute=compute,
    backends=lambda device_type: f"triton-mla-splitkv ({mode()})",
    op="mla",
))
