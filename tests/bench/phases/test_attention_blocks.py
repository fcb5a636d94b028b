"""The reference decoder's attention by kind: which impls can serve a model's MLA, window and sink layers (probed
before anything is measured), and MLA's absorbed decode against its decompressed prompt in float64."""

from __future__ import annotations

import pytest
import torch
from phasebench.bench.phases.attention_blocks import unserved
from phasebench.bench.phases.reference_decoder import ReferenceDecoder
from phasebench.bench.spec.models import MODELS, DecoderConfig

# head_dim differs from the latent's width and from kv_lora_rank: a probe built at the wrong width is refused
MLA = DecoderConfig(hidden=96, intermediate=24, layers=2, q_heads=3, kv_heads=3, head_dim=10, vocab=67, name="mla",
                    experts=5, top_k=2, dense_layers=1, dense_intermediate=40, kv_lora_rank=14, qk_rope_head_dim=6,
                    qk_nope_head_dim=12)
IMPLS = {"attention": "flash", "mla": "torch"}


@pytest.mark.parametrize("model", [MLA, MODELS["deepseek-v2-lite"], MODELS["gpt-oss-20b"], MODELS["llama-3-8b"]],
                         ids=["tiny-mla", "deepseek-v2-lite", "gpt-oss-20b", "llama-3-8b"])
def test_the_default_impls_serve_every_kind_on_the_host(model):
    assert unserved(model, IMPLS, "cpu", torch.float32) == ""
    assert unserved(model, {**IMPLS, "mla": "naive", "attention": "naive"}, "cpu", torch.float32) == ""


def test_an_impl_without_a_window_or_sinks_is_named_in_one_line():
    why = unserved(MODELS["gpt-oss-20b"], {**IMPLS, "attention": "sdpa_efficient"}, "cpu", torch.float32)
    assert why.startswith("attention=sdpa_efficient cannot serve gpt-oss-20b's sliding-window layers with sinks on "
                          "cpu (") and why.endswith("choose another with --impl attention=...") and "\n" not in why


def test_an_mla_decode_step_absorbed_equals_the_same_token_decompressed_in_a_prompt():
    """Decode (absorbed: kv_b's halves folded into q and out of the latent output, kernels.mla_decode) and prefill
    (kv_b over every cached latent, attention per head) are one computation: the last token agrees in float64."""
    decoder = ReferenceDecoder(MLA, 2, "cpu", torch.float64, max_tokens=24, max_batch=2, seed=3, moe_impl="naive",
                               impls={"mla": "naive"})
    x = torch.randn(2, 19, MLA.hidden, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    _, whole = decoder.prefill(2, 19, x=x, return_hidden=True)
    decoder.prefill(2, 18, x=x[:, :18])
    _, step = decoder.decode_step(2, 18, x=x[:, 18:], return_hidden=True)
    torch.testing.assert_close(step[:, -1], whole[:, -1], rtol=1e-10, atol=1e-10)
