"""Float64 reference attention and the tolerance rules the kernel tests apply."""

from __future__ import annotations

import torch


def make_qkv(batch, q_heads, kv_heads, q_len, kv_len, head_dim, *, dtype=torch.float32, device="cpu", seed=0):
    """Fresh standard-normal q, k, v (never zeros) from a fixed seed."""
    gen = torch.Generator().manual_seed(seed)
    kv_shape = (batch, kv_heads, kv_len, head_dim)
    shapes = [(batch, q_heads, q_len, head_dim), kv_shape, kv_shape]
    return [torch.randn(s, generator=gen).to(dtype=dtype, device=device) for s in shapes]


def reference(q, k, v, *, causal=False, scale=None, seqlens=None, dtype=torch.float64, window_left=-1, sinks=None):
    """Attention computed by the textbook formula in `dtype` (softmax in at least fp32); a window keeps keys j >= the
    query's position - window_left, a sink is one more logit per head that softmax normalises and the output drops."""
    b, hq, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    group = hq // hkv
    qq, kk, vv = (t.to(dtype) for t in (q, k, v))
    kk = kk.repeat_interleave(group, dim=1)
    vv = vv.repeat_interleave(group, dim=1)
    scores = (qq @ kk.transpose(-1, -2)).to(torch.promote_types(dtype, torch.float32)) * (scale or d ** -0.5)
    lengths = torch.tensor(seqlens if seqlens is not None else [sk] * b, device=q.device)
    keys = torch.arange(sk, device=q.device)
    keep = keys[None, None, :] < lengths[:, None, None]
    last = lengths[:, None] - sq + torch.arange(sq, device=q.device)[None, :]
    if causal:
        keep = keep & (keys[None, None, :] <= last[:, :, None])
    if window_left >= 0:
        keep = keep & (keys[None, None, :] >= last[:, :, None] - window_left)
    scores = scores.masked_fill(~keep[:, None], float("-inf"))
    if sinks is None:
        return torch.softmax(scores, dim=-1).to(dtype) @ vv
    column = sinks.to(scores.dtype).view(1, hq, 1, 1).expand(b, hq, sq, 1)
    probs = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]
    return probs.to(dtype) @ vv


def max_error(out, ref) -> float:
    return (out.double() - ref.double()).abs().max().item()


def assert_matches_reference(out, q, k, v, *, causal=False, scale=None, seqlens=None, window_left=-1, sinks=None):
    """fp32: relative error <= 1e-4; fp16/bf16: at most twice the error of the same naive math in that dtype."""
    assert out.shape == q.shape and out.dtype == q.dtype
    assert torch.isfinite(out).all(), "output has NaN/inf: unwritten (poisoned) or overflowed elements"
    extra = dict(window_left=window_left, sinks=None if sinks is None else sinks.cpu())
    exact = reference(q, k, v, causal=causal, scale=scale, seqlens=seqlens, **extra)
    err = max_error(out, exact)
    if q.dtype in (torch.float32, torch.float64):
        rel = err / exact.abs().max().item()
        assert rel <= 1e-4, f"relative error {rel:.3g} > 1e-4"
    else:
        low = reference(q, k, v, causal=causal, scale=scale, seqlens=seqlens, dtype=q.dtype, **extra)
        budget = 2 * max_error(low, exact) + 1e-5
        assert err <= budget, f"error {err:.3g} > 2 x naive {q.dtype} error + eps = {budget:.3g}"


def to_pages(k, v, page_size, seqlens=None, *, seed=0, spare=2, pad=-1):
    """K and V [B, Hkv, Sk, D] laid into pools [num_pages, page_size, Hkv, D] in a seeded shuffled order, with the
    int32 block table [B, ceil(Sk / page_size)]: sequence b holds ceil(seqlens[b] / page_size) pages, the tail of its
    last page holds other random values, `spare` pages no table names hold NaN (a kernel must never read them), and
    table entries past a sequence's pages hold `pad`."""
    b, hkv, sk, d = k.shape
    lens = list(seqlens) if seqlens is not None else [sk] * b
    counts = [-(-n // page_size) for n in lens]
    gen = torch.Generator().manual_seed(seed)
    total = sum(counts) + spare
    pools = [torch.randn((total, page_size, hkv, d), generator=gen).to(k.dtype) for _ in range(2)]
    order = torch.randperm(total, generator=gen)
    for pool in pools:
        pool[order[sum(counts):]] = float("nan")
    table = torch.full((b, -(-sk // page_size)), pad, dtype=torch.int32)
    start = 0
    for i, (n, count) in enumerate(zip(lens, counts, strict=True)):
        table[i, :count] = order[start:start + count].to(torch.int32)
        start += count
        for p in range(count):
            lo, hi = p * page_size, min((p + 1) * page_size, n)
            for pool, src in zip(pools, (k, v), strict=True):
                pool[table[i, p], :hi - lo] = src[i, :, lo:hi].transpose(0, 1).to(pool.device)
    return pools[0].to(k.device), pools[1].to(k.device), table.to(k.device)
