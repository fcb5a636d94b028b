"""Inputs for a case and the higher-precision reference every output is checked against before timing."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ....kernels import attention
from ...instruments.gate import relative_error
from ...instruments.roofline import TORCH_DTYPES
from .cases import AttentionCase
from .cost import ELEMENT_BYTES
from .pages import keys_in_order, make_pages

# The reference takes query rows and keys in chunks so its scratch stays near this size.
REFERENCE_SCORE_BYTES = 1 << 30
# Standard-normal q and k give logits of about +-4, where softmax without its max subtraction never overflows;
# q x 30 gives logits of about +-100 at a few thousand keys, past exp's float32/bfloat16 range (88.7) and far
# past float16's (11.1).
LOGIT_SCALE = 30.0


@dataclass(frozen=True)
class CaseInputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cache_seqlens: torch.Tensor | None = None  # int32 [B] for a ragged case
    block_table: torch.Tensor | None = None  # int32 [B, max_pages] for a paged case (k, v are then its pools)


def make_inputs(case: AttentionCase, device: torch.device, seed: int = 0) -> CaseInputs:
    """Standard-normal q, k, v in the case's dtype, from a fixed seed (never zeros); for a paged case, k and v are
    pools of pages in shuffled order with their block table (bench/ops/attention/pages.py)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = TORCH_DTYPES[case.dtype]

    def draw(heads, length):
        return torch.randn((case.batch, heads, length, case.head_dim), generator=gen, device=device, dtype=dtype)

    q = draw(case.q_heads, case.q_len)
    lens = None if case.seqlens is None else torch.tensor(case.seqlens, dtype=torch.int32, device=device)
    if case.paged:  # with cache_seqlens always, as a server calls it: kv_len need not fill the last page
        k, v, table = make_pages(case, gen, dtype, device)
        lens = torch.tensor(case.lengths, dtype=torch.int32, device=device)
        return CaseInputs(q, k, v, cache_seqlens=lens, block_table=table)
    return CaseInputs(q, draw(case.kv_heads, case.kv_len), draw(case.kv_heads, case.kv_len), lens)


def large_logits(case: AttentionCase, inputs: CaseInputs) -> CaseInputs:
    """The same keys and values with q x LOGIT_SCALE: a kernel that skips softmax's max subtraction overflows."""
    return dataclasses.replace(inputs, q=inputs.q * LOGIT_SCALE)


def reference_dtype(case: AttentionCase, device: torch.device) -> torch.dtype:
    """fp64 on the host for cases of modest size; fp32 on GPUs, where fp64 is slow."""
    return torch.float64 if device.type == "cpu" else torch.float32


def _kv_chunk_bytes(case: AttentionCase, keys: int, elem: int) -> int:
    """One upcast chunk of K and of V (a paged case gathers it in its own dtype first, with an int64 index)."""
    gathered = (case.head_dim * ELEMENT_BYTES[case.dtype] + 8) if case.paged else 0
    return 2 * case.batch * case.kv_heads * keys * (case.head_dim * elem + gathered)


def _row_bytes(case: AttentionCase, keys: int, elem: int) -> int:
    """Per query row against one key chunk: scores (+ the mask, at most as large), the upcast q row,
    the accumulator and the P.V product (4 x D), and the running max, sum and their temporaries (8)."""
    return case.batch * case.q_heads * (2 * keys + 4 * case.head_dim + 8) * elem


def _reference_chunks(case: AttentionCase, elem: int) -> tuple[int, int]:
    """Query rows and keys per step of the reference, so one step's scratch stays within REFERENCE_SCORE_BYTES."""
    # half the budget for one upcast K/V chunk and a row of scores against it, the rest for more rows
    per_key = _kv_chunk_bytes(case, 1, elem) + _row_bytes(case, 1, elem) - _row_bytes(case, 0, elem)
    keys = max(1, min(case.kv_len, REFERENCE_SCORE_BYTES // 2 // per_key))
    room = REFERENCE_SCORE_BYTES - _kv_chunk_bytes(case, keys, elem)
    rows = max(1, min(case.q_len, room // _row_bytes(case, keys, elem)))
    return rows, keys


def reference_scratch_bytes(case: AttentionCase, device: torch.device) -> int:
    """Peak memory the reference allocates beyond its output: within REFERENCE_SCORE_BYTES unless one
    row of one key is already larger (then one row's worth), whatever the KV length."""
    elem = reference_dtype(case, device).itemsize
    rows, keys = _reference_chunks(case, elem)
    return _kv_chunk_bytes(case, keys, elem) + rows * _row_bytes(case, keys, elem)


def _sequence_lengths(case: AttentionCase, inputs: CaseInputs) -> tuple[int, ...] | None:
    """Per-sequence KV lengths from the case, else from the inputs' cache_seqlens; None when every sequence is full."""
    lens = getattr(case, "seqlens", None)
    if lens is None and getattr(inputs, "cache_seqlens", None) is not None:
        lens = tuple(int(n) for n in inputs.cache_seqlens.tolist())
    if lens is not None and len(lens) != case.batch:
        raise ValueError(f"seqlens: must hold batch={case.batch} lengths, got {len(lens)}")
    return None if lens is None else tuple(lens)


def reference(case: AttentionCase, inputs: CaseInputs, device: torch.device) -> torch.Tensor:
    """Attention in higher precision (fp64 on the host, fp32 without TF32 on a GPU), in bounded memory.

    Query rows and keys are taken in chunks, each K/V chunk upcast on its own, and the partial
    softmax of successive key chunks merged with the running max / sum rule, so the scratch stays
    near REFERENCE_SCORE_BYTES whatever the KV length. Bottom-right causal and per-sequence
    lengths as in the `attention` contract; GQA by folding a kv head's query heads into rows.
    """
    dtype = reference_dtype(case, device)
    b, hq, hkv, sq, sk, d = case.batch, case.q_heads, case.kv_heads, case.q_len, case.kv_len, case.head_dim
    group, scale = hq // hkv, d ** -0.5
    lens = _sequence_lengths(case, inputs)
    lengths = torch.tensor(lens if lens is not None else (sk,) * b, device=device)
    shortest, longest = (min(lens), max(lens)) if lens is not None else (sk, sk)
    rows, keys = _reference_chunks(case, dtype.itemsize)
    out = torch.empty((b, hq, sq, d), dtype=dtype, device=device)
    previous_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for start in range(0, sq, rows):
            stop = min(start + rows, sq)
            r = stop - start
            q = inputs.q[:, :, start:stop].to(dtype).reshape(b, hkv, group * r, d)
            top = torch.full((b, hkv, group, r), float("-inf"), dtype=dtype, device=device)  # running max
            total = torch.zeros_like(top)  # running sum of exp(score - top)
            acc = torch.zeros((b, hkv, group, r, d), dtype=dtype, device=device)
            # the last key any row of this chunk sees: Sk - Sq + stop - 1 with causal (bottom-right)
            end = longest - sq + stop if case.causal else longest
            for k0 in range(0, end, keys):
                k1 = min(k0 + keys, end)
                k, v = (t.to(dtype) for t in keys_in_order(inputs, case, k0, k1))
                s = torch.matmul(q, k.transpose(-1, -2)).view(b, hkv, group, r, k1 - k0).mul_(scale)
                del k
                # a chunk every row of every sequence sees in full needs no mask
                if k1 > (shortest - sq + start + 1 if case.causal else shortest):
                    ids = torch.arange(k0, k1, device=device)
                    keep = ids[None, None, :] < lengths[:, None, None]
                    if case.causal:
                        last = lengths[:, None] - sq + torch.arange(start, stop, device=device)[None, :]
                        keep = keep & (ids[None, None, :] <= last[:, :, None])
                    s.masked_fill_(~keep[:, None, None], float("-inf"))
                new_top = torch.maximum(top, s.amax(dim=-1))
                shift = new_top.masked_fill(new_top == float("-inf"), 0.0)  # rows with no key yet stay at zero
                alpha = torch.exp(top - shift)
                p = s.sub_(shift[..., None]).exp_()
                total.mul_(alpha).add_(p.sum(dim=-1))
                pv = torch.matmul(p.view(b, hkv, group * r, k1 - k0), v).view(b, hkv, group, r, d)
                acc.mul_(alpha[..., None]).add_(pv)
                top = new_top
                del s, p, pv, v
            out[:, :, start:stop] = acc.div_(total[..., None]).view(b, hq, r, d)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous_tf32
    return out


# The low-precision baseline is computed in slices of (sequence, query rows) of at most this many scores.
BASELINE_SCORES = 1 << 27


def naive_in_dtype(case: AttentionCase, inputs: CaseInputs) -> torch.Tensor:
    """The naive math in the case's own dtype, a slice of sequences and query rows at a time (bounded scratch)."""
    out = torch.empty_like(inputs.q)
    lens = case.lengths
    rows = max(1, BASELINE_SCORES // (case.q_heads * case.kv_len))
    for b in range(case.batch):
        keys_b = lens[b]
        for start in range(0, case.q_len, rows):
            stop = min(start + rows, case.q_len)
            # query i keeps keys j <= L - Sq + i: cutting the keys at L - Sq + stop keeps the causal mask exact
            keys = keys_b - case.q_len + stop if case.causal else keys_b
            k, v = keys_in_order(inputs, case, 0, keys, slice(b, b + 1))
            out[b:b + 1, :, start:stop] = attention(inputs.q[b:b + 1, :, start:stop], k, v, impl="naive",
                                                    causal=case.causal)
    return out


def baseline_error(case: AttentionCase, inputs: CaseInputs, reference: torch.Tensor) -> float | None:
    """The relative error of the naive math in the case's dtype (None where the dtype has a fixed limit)."""
    if case.dtype == "float32":  # fp32 has a fixed limit
        return None
    return relative_error(naive_in_dtype(case, inputs), reference)
