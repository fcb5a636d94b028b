"""Naive attention: fp32 scores as a matmul, softmax in fp32 (a sink logit joining its denominator), then a matmul
(materialises the scores, a window as a mask; a ragged batch's P.V per sequence, over its own keys); a paged cache is
gathered into contiguous K/V first, inside the call; an fp8 cache is dequantized to q's dtype (after the gather),
inside the call."""

from __future__ import annotations

import torch

from .. import buffers
from ..registry import Impl, PlannedCall, add_builtin, dtype_name
from .fp8 import dequantized
from .paged import contiguous, gatherer
from .request import AttentionRequest


def allowed_keys(req: AttentionRequest, first: int = 0) -> torch.Tensor | None:
    """Boolean mask [B or 1, Sq, Sk - first] of the (query, key) pairs kept among keys first..Sk-1, or None when all
    are kept."""
    if not req.causal and not req.ragged and not req.windowed:
        return None
    dev = req.q.device
    keys = torch.arange(first, req.kv_len, device=dev)
    lengths = (req.cache_seqlens.to(torch.int64) if req.seqlens is not None
               else torch.full((1,), req.kv_len, device=dev, dtype=torch.int64))
    keep = keys[None, None, :] < lengths[:, None, None]
    # bottom-right: query row i sits at position L - Sq + i
    position = lengths[:, None] - req.q_len + torch.arange(req.q_len, device=dev)[None, :]
    if req.causal:
        keep = keep & (keys[None, None, :] <= position[:, :, None])
    if req.windowed:
        keep = keep & (keys[None, None, :] >= position[:, :, None] - req.window_left)
    return keep


def window_start(req: AttentionRequest) -> int:
    """The first key any query of the request may see: 0 without a window, else the shortest sequence's last
    query position minus its span, clamped at 0 (the keys before it are outside every row's window)."""
    if not req.windowed:
        return 0
    shortest = min(req.seqlens) if req.seqlens is not None else req.kv_len
    return max(0, shortest - req.q_len - req.window_left)


def sink_softmax(scores: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """softmax(scores) with one more logit per head in the denominator: exp(l_j - m) / (exp(s_h - m) +
    sum_j exp(l_j - m)), m the larger of the row's max and the sink; `sinks` broadcasts against the scores' rows."""
    top = torch.maximum(scores.amax(dim=-1, keepdim=True), sinks)
    probs = scores.sub(top).exp_()
    return probs.div_(probs.sum(dim=-1, keepdim=True).add_(sinks.sub(top).exp_()))


def naive_attention(req: AttentionRequest) -> torch.Tensor:
    q, k, v = req.q, req.k, req.v
    b, hq, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    group = hq // hkv
    # GQA without copying K/V: the `group` query heads that share a kv head are stacked along
    # the query rows, so one [G*Sq, D] x [D, Sk] matmul per kv head serves all of them.
    # the scores in fp32 from the low-precision operands, as a tiled kernel keeps them: rounded to bf16, a logit of
    # 100 would move by 0.25 (a probability by 28%)
    acc_dtype = torch.promote_types(q.dtype, torch.float32)
    q_rows = q.reshape(b, hkv, group * sq, d).to(acc_dtype)
    scores = torch.matmul(q_rows, k.to(acc_dtype).transpose(-1, -2))
    scores = scores.mul_(req.scale).view(b, hkv, group, sq, sk)
    keep = allowed_keys(req)
    if keep is not None:
        scores = scores.masked_fill(~keep[:, None, None], float("-inf"))
    if req.sinks is not None:
        probs = sink_softmax(scores, req.sinks.to(acc_dtype).view(1, hkv, group, 1, 1))
    else:
        probs = torch.softmax(scores, dim=-1)
    # the output has v's head dim (MLA's value is narrower than its key: kernels/mla/)
    probs = probs.to(v.dtype).view(b, hkv, group * sq, sk)
    if not req.ragged:
        return torch.matmul(probs, v).view(b, hq, sq, v.shape[-1])
    # what lies past a sequence's length may be anything (a server's stale values, NaN), and a probability of 0
    # times NaN is NaN: each sequence multiplies its own keys' values only
    out = buffers.empty((b, hkv, group * sq, v.shape[-1]), dtype=v.dtype, device=v.device)
    for i, n in enumerate(req.seqlens):
        torch.matmul(probs[i, :, :, :n], v[i, :, :n], out=out[i])
    return out.view(b, hq, sq, v.shape[-1])


def _plan(req: AttentionRequest) -> PlannedCall:
    decode = dequantized if req.kv_fp8 else (lambda r: r)  # fp8 codes x scales, rounded to q's dtype, in the call
    label = "fp8-dequant+" if req.kv_fp8 else ""
    if req.paged:  # the pages copied into contiguous K/V inside the call, then the same math
        gather = gatherer(req)
        return PlannedCall("naive", f"gather+{label}torch-matmul",
                           lambda: naive_attention(decode(contiguous(req, *gather()))))
    return PlannedCall("naive", f"{label}torch-matmul", lambda: naive_attention(decode(req)))


def scores_fp32(device_type: str, dtype: torch.dtype, fields) -> str:
    """What naive_attention computes in: half of its FLOPs (the scores) in fp32, half (P.V) in the input dtype."""
    name = dtype_name(dtype)
    return name if dtype in (torch.float32, torch.float64) else f"float32+{name}"


NAIVE = add_builtin(Impl(
    name="naive",
    summary="fp32 score matmul, fp32 softmax, matmul; materialises the [Sq, Sk] scores; GQA folds query heads "
            "into rows",
    devices=frozenset({"cpu", "cuda"}),
    dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64}),
    plan=_plan,
    paged=True,
    window=True,
    sinks=True,
    max_head_dim=1 << 16,
    fp8_kv=True,
    backends=lambda device_type: "torch-matmul",
    compute=scores_fp32,
))
