"""MLA's fp8 latent cache (e4m3 codes, one float32 scale): naive and triton against a float64 reference built from
the codes decoded from their bits times the scale, contiguous and paged (pages of odd size), one and two query tokens;
SDPA's and flex's refusals with their reason; the one-line errors of a bad latent scale."""

from __future__ import annotations

import pytest
import torch
from phasebench.kernels import Unsupported, mla_decode, prepare_mla

from ..attention.test_fp8_kv import decoded, fp8_pages, quantize
from ..reference import max_error, reference

# MLA: (batch, Hq, q_len, kv_len, D, Dv, seqlens, page)
MLA_SHAPES = {
    "mla-decode": (2, 16, 1, 150, 80, 64, None, 0),
    "mla-mtp-paged-p11-ragged": (2, 16, 2, 97, 80, 64, (97, 12), 11),
}


@pytest.mark.parametrize("impl", ["naive", "triton"])
@pytest.mark.parametrize("name", MLA_SHAPES)
def test_fp8_latent_matches_the_decoded_reference(name, impl):
    b, hq, sq, sk, d, dv, seqlens, page = MLA_SHAPES[name]
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    q = torch.randn((b, hq, sq, d), generator=gen).to(torch.bfloat16)
    latent, scale = quantize(torch.randn((b, 1, sk, d), generator=gen) * 2.0, per_head=False)
    exact = decoded(latent, scale)
    lens = None if seqlens is None else torch.tensor(seqlens, dtype=torch.int32)
    extra = {}
    if page:
        latent, table = fp8_pages(latent, page, seqlens, seed=3)
        extra = {"block_table": table}
    out = mla_decode(q, latent, impl=impl, scale=0.1, v_dim=dv, cache_seqlens=lens, latent_scale=scale, **extra)
    ref = reference(q, exact, exact[..., :dv], causal=True, scale=0.1, seqlens=seqlens)
    low = reference(q, exact, exact[..., :dv], causal=True, scale=0.1, seqlens=seqlens, dtype=torch.bfloat16)
    assert out.shape == (b, hq, sq, dv) and torch.isfinite(out).all()
    assert max_error(out, ref) <= 2 * max_error(low, ref) + 1e-5


@pytest.mark.parametrize("impl,reason", [("torch", "SDPA"), ("flex", "flex_attention")])
def test_mla_sdpa_and_flex_refuse_an_fp8_latent(impl, reason):
    latent, scale = quantize(torch.randn(1, 1, 32, 80), per_head=False)
    with pytest.raises(Unsupported, match=reason):
        prepare_mla(torch.randn(1, 16, 1, 80), latent, impl=impl, scale=0.1, v_dim=64, latent_scale=scale)


@pytest.mark.parametrize("scale,message", [(None, "latent_scale: a float8_e4m3fn cache needs its scale"),
                                           (torch.ones(1), r"latent_scale: must have shape \[\]")])
def test_bad_latent_scales_are_one_line_value_errors(scale, message):
    latent, _ = quantize(torch.randn(1, 1, 32, 80), per_head=False)
    with pytest.raises(ValueError, match=message):
        prepare_mla(torch.randn(1, 16, 1, 80), latent, impl="naive", scale=0.1, v_dim=64, latent_scale=scale)
