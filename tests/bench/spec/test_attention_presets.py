"""The attention presets: the published dims of DeepSeek-V2-Lite/V3 (MLA) and gpt-oss-20b/120b (window and sinks),
the numbers derived from them, and one-line errors for a preset of the other kind."""

from __future__ import annotations

import pytest
from phasebench.bench.spec.attention_presets import ATTENTION_PRESETS, mla_preset, window_preset


def test_mla_presets_absorb_into_a_576_wide_latent():
    lite, v3 = mla_preset("deepseek-v2-lite"), mla_preset("deepseek-v3")
    assert (lite.q_heads, lite.layers, v3.q_heads, v3.layers) == (16, 27, 128, 61)
    for p in (lite, v3):
        assert (p.latent_dim, p.v_dim, p.softmax_scale) == (576, 512, 192 ** -0.5)
    # one latent per layer and token: 61 x 576 x 2 bytes for V3 in bf16
    assert v3.kv_bytes_per_token(2) == 61 * 576 * 2


def test_gpt_oss_alternates_window_and_full_layers():
    small, large = window_preset("gpt-oss-20b"), window_preset("gpt-oss-120b")
    assert (small.layers, large.layers) == (24, 36)
    for p in (small, large):
        assert (p.q_heads, p.kv_heads, p.head_dim, p.sliding_window, p.window_left) == (64, 8, 64, 128, 127)
        assert p.window_layers == p.full_layers == p.layers // 2 and p.sinks
    # at 128 tokens every layer keeps them all; at 8192 the window layers keep 128
    per_layer = 2 * 8 * 64 * 2
    assert small.kv_bytes_per_token(2, 128) == 24 * per_layer
    assert small.kv_bytes_per_token(2, 8192) == per_layer * (12 + 12 * 128 / 8192)


def test_a_preset_of_the_other_kind_is_one_line():
    with pytest.raises(ValueError, match="'gpt-oss-20b' has no MLA attention"):
        mla_preset("gpt-oss-20b")
    with pytest.raises(ValueError, match="'deepseek-v3' has no sliding-window attention"):
        window_preset("deepseek-v3")
    with pytest.raises(ValueError, match="no attention preset 'llama-3-8b'"):
        window_preset("llama-3-8b")
    assert set(ATTENTION_PRESETS) == {"deepseek-v2-lite", "deepseek-v3", "gpt-oss-20b", "gpt-oss-120b"}
