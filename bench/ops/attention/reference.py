"""The higher-precision reference of an attention case, in bounded memory: blocked online-softmax attention that the
low-precision baseline (baseline.py) also runs, with its rounding points, in fp32."""

from __future__ import annotations

import torch

from ..qlinear.unpack import e4m3_values
from .cases import AttentionCase
from .cost import ELEMENT_BYTES
from .inputs import CaseInputs, sequence_lengths
from .pages import keys_in_order

# The reference takes query rows and keys in chunks so its scratch stays near this size.
REFERENCE_SCORE_BYTES = 1 << 30


def reference_dtype(case: AttentionCase, device: torch.device) -> torch.dtype:
    """fp64 on every device: an fp32 reference on a GPU runs the same fp32 matmuls as an fp32 kernel under test."""
    return torch.float64


def _kv_chunk_bytes(case: AttentionCase, keys: int, elem: int) -> int:
    """One upcast chunk of K and of V (a paged case gathers it in its own dtype first, with an int64 index)."""
    gathered = (case.head_dim * ELEMENT_BYTES[case.dtype] + 8) if case.paged else 0
    return 2 * case.batch * case.kv_heads * keys * (case.head_dim * elem + gathered)


def _row_bytes(case: AttentionCase, keys: int, elem: int) -> int:
    """Per query row against one key chunk: scores (+ the mask or the baseline's rounded probabilities, at most as
    large), the upcast q row, the accumulator and the P.V product (4 x D), and the running max, sum and their
    temporaries (8)."""
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
    row of one key is already larger (then one row's worth), whatever the KV length. The baseline runs the same
    steps in fp32, never wider than the reference's dtype, so this bounds it too."""
    elem = reference_dtype(case, device).itemsize
    rows, keys = _reference_chunks(case, elem)
    return _kv_chunk_bytes(case, keys, elem) + rows * _row_bytes(case, keys, elem)


def kv_values(inputs: CaseInputs, case: AttentionCase, start: int, stop: int, dtype: torch.dtype,
              rounding: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of keys [start, stop) in BHSD order in `dtype`. An fp8 cache's codes are decoded from their bits (the
    gate's own e4m3_values, not torch's cast) times their scales (per KV head [Hkv], or one [] for the tensor); with
    `rounding` (the baseline), V's values are rounded to it first, as a kernel whose P.V product runs in that dtype
    holds them (K stays in the scores' precision)."""
    k, v = keys_in_order(inputs, case, start, stop)
    if getattr(inputs, "k_scale", None) is None:
        return k.to(dtype), v.to(dtype)
    out = []
    for codes, scale, rounded in ((k, inputs.k_scale, None), (v, inputs.v_scale, rounding)):
        scale = scale.to(torch.float64)
        value = e4m3_values(codes) * (scale.view(1, -1, 1, 1) if scale.dim() == 1 else scale)
        out.append((value if rounded is None else value.to(rounded)).to(dtype))
    return out[0], out[1]


def blocked_attention(case: AttentionCase, inputs: CaseInputs, device: torch.device, dtype: torch.dtype,
                      rounding: torch.dtype | None = None, scale: float | None = None) -> torch.Tensor:
    """Attention computed in `dtype` (TF32 off on a GPU), in bounded memory.

    Query rows and keys are taken in chunks, each K/V chunk upcast on its own, and the partial softmax of
    successive key chunks merged with the running max / sum rule, so the scratch stays near REFERENCE_SCORE_BYTES
    whatever the KV length. Bottom-right causal and per-sequence lengths as in the `attention` contract; GQA by
    folding a kv head's query heads into rows. With `rounding` (a low-precision dtype), the steps round where a
    tiled kernel does: the probabilities exp(s - running max) before P.V (the running sum keeps them unrounded) and
    the output, once; the result is in that dtype.

    A sliding window (case.window_left) masks keys j < the query's position - window_left and starts each query
    chunk at the first key its window reaches; sinks (inputs.sinks, one logit per query head) join the running sum
    once every key is in. The value may be narrower than the key (MLA: inputs.v a view of the latent's first dims);
    `scale` defaults to head_dim ** -0.5. An fp8 cache (inputs.k_scale) is decoded by kv_values.
    """
    b, hq, hkv, sq, sk, d = case.batch, case.q_heads, case.kv_heads, case.q_len, case.kv_len, case.head_dim
    group, scale, dv = hq // hkv, scale or d ** -0.5, inputs.v.shape[-1]
    window = getattr(case, "window_left", -1)
    lens = sequence_lengths(case, inputs)
    lengths = torch.tensor(lens if lens is not None else (sk,) * b, device=device)
    shortest, longest = (min(lens), max(lens)) if lens is not None else (sk, sk)
    rows, keys = _reference_chunks(case, dtype.itemsize)
    out = torch.empty((b, hq, sq, dv), dtype=rounding or dtype, device=device)
    previous_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for start in range(0, sq, rows):
            stop = min(start + rows, sq)
            r = stop - start
            q = inputs.q[:, :, start:stop].to(dtype).reshape(b, hkv, group * r, d)
            top = torch.full((b, hkv, group, r), float("-inf"), dtype=dtype, device=device)  # running max
            total = torch.zeros_like(top)  # running sum of exp(score - top)
            acc = torch.zeros((b, hkv, group, r, dv), dtype=dtype, device=device)
            # the last key any row of this chunk sees: Sk - Sq + stop - 1 with causal (bottom-right); with a window the
            # first is the shortest sequence's first row's position - window_left, and the largest left edge the
            # longest sequence's last row's
            end = longest - sq + stop if case.causal else longest
            first = max(0, shortest - sq + start - window) if window >= 0 else 0
            edge = longest - sq + stop - 1 - window if window >= 0 else 0
            for k0 in range((first // keys) * keys, end, keys):
                k1 = min(k0 + keys, end)
                k, v = kv_values(inputs, case, k0, k1, dtype, rounding)
                s = torch.matmul(q, k.transpose(-1, -2)).view(b, hkv, group, r, k1 - k0).mul_(scale)
                del k
                # a chunk every row of every sequence sees in full needs no mask
                if k1 > (shortest - sq + start + 1 if case.causal else shortest) or k0 < edge:
                    ids = torch.arange(k0, k1, device=device)
                    keep = ids[None, None, :] < lengths[:, None, None]
                    if k1 > shortest:  # past a length the cache may hold anything (the gate puts NaN there): 0 x NaN
                        v = v.masked_fill(~keep[..., None], 0.0)
                    position = lengths[:, None] - sq + torch.arange(start, stop, device=device)[None, :]
                    if case.causal:
                        keep = keep & (ids[None, None, :] <= position[:, :, None])
                    if window >= 0:
                        keep = keep & (ids[None, None, :] >= position[:, :, None] - window)
                    s.masked_fill_(~keep[:, None, None], float("-inf"))
                new_top = torch.maximum(top, s.amax(dim=-1))
                shift = new_top.masked_fill(new_top == float("-inf"), 0.0)  # rows with no key yet stay at zero
                alpha = torch.exp(top - shift)
                p = s.sub_(shift[..., None]).exp_()
                total.mul_(alpha).add_(p.sum(dim=-1))
                if rounding is not None:
                    p.copy_(p.to(rounding))
                pv = torch.matmul(p.view(b, hkv, group * r, k1 - k0), v).view(b, hkv, group, r, dv)
                acc.mul_(alpha[..., None]).add_(pv)
                top = new_top
                del s, p, pv, v
            if getattr(inputs, "sinks", None) is not None:  # each head's sink logit joins the denominator only
                sink = inputs.sinks.to(dtype).view(1, hkv, group, 1)
                new_top = torch.maximum(top, sink)
                alpha = torch.exp(top - new_top)
                acc.mul_(alpha[..., None])
                total.mul_(alpha).add_(torch.exp(sink - new_top))
            out[:, :, start:stop] = acc.div_(total[..., None]).view(b, hq, r, dv)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous_tf32
    return out


def reference(case: AttentionCase, inputs: CaseInputs, device: torch.device) -> torch.Tensor:
    """Attention in fp64 on every device, in bounded memory."""
    return blocked_attention(case, inputs, device, reference_dtype(case, device))
