"""FP8 KV caches (e4m3 codes with a scale per tensor or per KV head): naive and triton against a float64 reference
built from the codes decoded from their bits (not torch's cast) times the scales, contiguous, ragged, paged (pages of
odd size, NaN in the pages no table names) and verify; SDPA's and flex's refusals with their reason; the one-line
errors of bad scales."""

from __future__ import annotations

import pytest
import torch
from phasebench.bench.ops.qlinear.unpack import e4m3_values
from phasebench.kernels import Unsupported, attention, backend_for, prepare

from ..reference import assert_matches_reference, to_pages

FP8 = torch.float8_e4m3fn


def quantize(t: torch.Tensor, per_head: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 codes of a BHSD tensor and their float32 scale, amax / 448 per KV head (dim 1) or for the tensor."""
    amax = t.float().abs().amax(dim=(0, 2, 3)) if per_head else t.float().abs().amax()
    scale = (amax / 448.0).float()
    view = scale.view(1, -1, 1, 1) if per_head else scale
    return (t.float() / view).to(FP8), scale


def decoded(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float64 values of BHSD codes: the bits decoded independently of torch's cast, times the scale."""
    s = scale.double().view(1, -1, 1, 1) if scale.dim() == 1 else scale.double()
    return e4m3_values(codes) * s


def fp8_pages(codes: torch.Tensor, page: int, seqlens, seed: int):
    """The codes laid into shuffled pools of `page` tokens (exact: a code's float is itself), NaN in the spare pages."""
    pool, _, table = to_pages(codes.float(), codes.float(), page, seqlens, seed=seed)
    return pool.to(FP8), table


# (batch, Hq, Hkv, q_len, kv_len, D, causal, seqlens, page, per-head scales, dtype)
SHAPES = {
    "decode-head-scales": (2, 8, 2, 1, 333, 72, True, None, 0, True, torch.bfloat16),
    "verify-ragged-tensor-scale": (2, 6, 3, 3, 200, 40, True, (200, 57), 0, False, torch.bfloat16),
    "paged-p13-ragged": (2, 8, 2, 1, 150, 48, True, (150, 31), 13, True, torch.float32),
}
SLOW_SHAPES = {
    "decode-mqa-fp16-d96": (3, 8, 1, 1, 517, 96, True, None, 0, False, torch.float16),
    "verify-paged-p7": (2, 8, 2, 5, 131, 64, True, (131, 9), 7, True, torch.bfloat16),
    "paged-p64-fp32-tensor": (2, 4, 4, 1, 300, 80, False, (300, 65), 64, False, torch.float32),
    "decode-gqa8-bf16-d128": (1, 32, 4, 1, 1000, 128, True, None, 0, True, torch.bfloat16),
}
CASES = [pytest.param(n, s, id=n) for n, s in SHAPES.items()] + [
    pytest.param(n, s, id=n, marks=pytest.mark.slow) for n, s in SLOW_SHAPES.items()]


@pytest.mark.parametrize("impl", ["naive", "triton"])
@pytest.mark.parametrize("name,shape", CASES)
def test_fp8_cache_matches_the_decoded_reference(name, shape, impl):
    b, hq, hkv, sq, sk, d, causal, seqlens, page, per_head, dtype = shape
    seed = sum(map(ord, name))
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn((b, hq, sq, d), generator=gen).to(dtype)
    # K and V of unlike spreads (V x 3), so a swapped scale is caught
    (k, k_scale), (v, v_scale) = (quantize(torch.randn((b, hkv, sk, d), generator=gen) * spread, per_head)
                                  for spread in (1.0, 3.0))
    kd, vd = decoded(k, k_scale), decoded(v, v_scale)
    lens = None if seqlens is None else torch.tensor(seqlens, dtype=torch.int32)
    extra = {}
    if page:
        (k, table), (v, _) = fp8_pages(k, page, seqlens, seed), fp8_pages(v, page, seqlens, seed)
        extra = {"block_table": table}
    out = attention(q, k, v, impl=impl, causal=causal, cache_seqlens=lens, k_scale=k_scale, v_scale=v_scale, **extra)
    assert_matches_reference(out, q, kd, vd, causal=causal, seqlens=seqlens)


def test_triton_names_its_fp8_route_and_refuses_fp8_prefill():
    q = torch.randn(1, 4, 40, 32)
    k, ks = quantize(torch.randn(1, 2, 64, 32), per_head=True)
    assert backend_for(q[:, :, :1], k, k, impl="triton", k_scale=ks, v_scale=ks).startswith("triton-splitkv+fp8kv")
    with pytest.raises(Unsupported, match="split-KV decode kernel only"):
        prepare(q, k, k, impl="triton", causal=True, k_scale=ks, v_scale=ks)


@pytest.mark.parametrize("impl,reason", [("flash", "SDPA"), ("flex", "flex_attention")])
def test_sdpa_and_flex_refuse_an_fp8_cache_with_a_reason(impl, reason):
    q = torch.randn(1, 4, 1, 32)
    k, ks = quantize(torch.randn(1, 2, 64, 32), per_head=False)
    with pytest.raises(Unsupported, match=reason) as err:
        prepare(q, k, k, impl=impl, k_scale=ks, v_scale=ks)  # refused when planned, before anything compiles
    assert "fp8" in str(err.value) and "\n" not in str(err.value)


def _bad_args():
    q = torch.randn(1, 4, 1, 32)
    k, ks = quantize(torch.randn(1, 2, 16, 32), per_head=True)
    plain = torch.randn(1, 2, 16, 32)
    one = torch.tensor(0.01)
    return [
        ("no scale", dict(q=q, k=k, v=k), "k_scale: a float8_e4m3fn cache needs its scale"),
        ("v scale missing", dict(q=q, k=k, v=k, k_scale=ks), "v_scale: a float8_e4m3fn cache needs its scale"),
        ("fp64 scale", dict(q=q, k=k, v=k, k_scale=ks.double(), v_scale=ks), "k_scale: must have dtype float32"),
        ("scale per query head", dict(q=q, k=k, v=k, k_scale=torch.ones(4), v_scale=ks),
         r"k_scale: must have shape \[\] \(per tensor\) or \[Hkv\]=\[2\]"),
        ("scale on another device", dict(q=q, k=k, v=k, k_scale=one.to("meta"), v_scale=one), "k_scale: device"),
        ("negative scale", dict(q=q, k=k, v=k, k_scale=-one, v_scale=one), "k_scale: must be finite and positive"),
        ("scales with a float cache", dict(q=q, k=plain, v=plain, k_scale=one, v_scale=one),
         "k_scale: applies to a float8_e4m3fn cache only"),
        ("fp8 k and float v", dict(q=q, k=k, v=plain, k_scale=one, v_scale=one), "k/v: an fp8 cache holds K and V"),
        ("fp8 q", dict(q=q.to(torch.float8_e4m3fn), k=k, v=k, k_scale=one, v_scale=one),
         "q: must be a floating dtype"),
        ("e5m2 cache", dict(q=q, k=k.float().to(torch.float8_e5m2), v=k, k_scale=one, v_scale=one),
         "k: must be a floating dtype .* or float8_e4m3fn"),
    ]


@pytest.mark.parametrize("case", range(10))
def test_bad_fp8_arguments_are_one_line_value_errors(case):
    name, args, message = _bad_args()[case]
    q, k, v = args.pop("q"), args.pop("k"), args.pop("v")
    with pytest.raises(ValueError, match=message) as err:
        attention(q, k, v, impl="naive", **args)
    assert "\n" not in str(err.value), name
