"""The `triton` implementation: picks the split-KV decode kernel or the tiled prefill kernel."""

from __future__ import annotations

import torch
import triton

from .. import buffers, triton_mode
from ..errors import Unsupported
from ..registry import Impl, PlannedCall, add_builtin
from ..triton_mode import interpreted, mode
from .fp8 import triton_refusal
from .request import AttentionRequest, validate
from .triton_decode import launch_split_kv
from .triton_prefill import launch_prefill

# Up to this many query rows per KV head (GQA group x q_len) one split-KV program holds them all.
SPLIT_KV_MAX_ROWS = 128
SPLIT_KV_MAX_Q_LEN = 16
MIN_BLOCK_D = 16  # tl.dot needs at least 16 along each dimension


def uses_split_kv(req: AttentionRequest) -> bool:
    group = req.q_heads // req.kv_heads
    return req.q_len <= SPLIT_KV_MAX_Q_LEN and group * req.q_len <= SPLIT_KV_MAX_ROWS


def _launch_options(req: AttentionRequest) -> tuple[int, bool, str]:
    block_d = max(MIN_BLOCK_D, triton.next_power_of_2(req.head_dim))
    # the interpreter has no bf16/fp16 arithmetic: load, upcast to fp32, cast back at the store
    upcast = interpreted()
    precision = "ieee" if req.dtype == torch.float32 else "tf32"
    return block_d, upcast, precision


FP8_PREFILL_REFUSAL = (f"triton reads an fp8 KV cache in its split-KV decode kernel only (up to {SPLIT_KV_MAX_Q_LEN} "
                       f"query tokens and {SPLIT_KV_MAX_ROWS} rows per KV head); its prefill kernel reads K/V in q's "
                       "dtype")


def triton_attention(req: AttentionRequest) -> torch.Tensor:
    """Run the Triton kernel that suits a validated request."""
    out = buffers.empty_like(req.q)
    block_d, upcast, precision = _launch_options(req)
    if uses_split_kv(req):
        launch_split_kv(req, out, block_d, upcast, precision, num_splits=None)
    else:
        launch_prefill(req, out, block_d, upcast, precision)
    return out


def split_kv_attention(q, k, v, *, causal=False, scale=None, cache_seqlens=None, block_table=None, window_left=-1,
                       sinks=None, num_splits=None, k_scale=None, v_scale=None) -> torch.Tensor:
    """The split-KV decode kernels called directly; `num_splits` overrides the chosen split count."""
    req = validate(q, k, v, causal=causal, scale=scale, cache_seqlens=cache_seqlens, block_table=block_table,
                   window_left=window_left, sinks=sinks, k_scale=k_scale, v_scale=v_scale)
    TRITON.check(req)
    if not uses_split_kv(req):
        raise Unsupported(f"split-KV serves up to {SPLIT_KV_MAX_Q_LEN} query tokens and "
                          f"{SPLIT_KV_MAX_ROWS} rows per KV head, got q_len={req.q_len}")
    out = buffers.empty_like(req.q)
    launch_split_kv(req, out, *_launch_options(req), num_splits=num_splits)
    return out


def _plan(req: AttentionRequest) -> PlannedCall:
    if req.kv_fp8 and not uses_split_kv(req):
        raise Unsupported(FP8_PREFILL_REFUSAL)
    if req.kv_fp8 and (why := triton_refusal(req.q.device)):
        raise Unsupported(why)
    backend = ("triton-splitkv" if uses_split_kv(req) else "triton-prefill") + ("+paged" if req.paged else "")
    backend += "+fp8kv" if req.kv_fp8 else ""
    return PlannedCall("triton", f"{backend}:{mode()}", lambda: triton_attention(req))


TRITON = add_builtin(Impl(
    name="triton",
    summary="phasebench's Triton kernels: tiled online-softmax prefill, split-KV (Flash-Decoding) decode; windows "
            "skip whole blocks, sinks join the final normalisation",
    devices=frozenset({"cpu", "cuda"}),
    dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32}),
    plan=_plan,
    paged=True,
    window=True,
    sinks=True,
    fp8_kv=True,  # in the split-KV decode kernel; the prefill kernel's requests raise Unsupported when planned
    unavailable=triton_mode.why_unavailable,
    backends=lambda device_type: f"triton-prefill, triton-splitkv ({mode()})",
    compute=triton_mode.compute,
))
