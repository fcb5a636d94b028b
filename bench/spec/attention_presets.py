"""The attention of models that do not run GQA over a full cache (no torch): DeepSeek's MLA over a latent cache and
gpt-oss's sliding-window layers with sinks, from the models' published config.json (docs/attention-kinds.md cites
them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MLAPreset:
    """Multi-head latent attention (DeepSeek-V2/V3): each token caches one latent of kv_lora_rank compressed dims and
    qk_rope_head_dim rotary dims, shared by every head; decode runs the heads against it with the projections
    absorbed (the query in latent space), the value being the latent's first kv_lora_rank dims."""

    name: str
    q_heads: int  # num_attention_heads
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    layers: int  # num_hidden_layers

    @property
    def latent_dim(self) -> int:
        """The head dim decode attends with: the latent and the query absorbed into it (576 for DeepSeek)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def v_dim(self) -> int:
        return self.kv_lora_rank

    @property
    def softmax_scale(self) -> float:
        """1/sqrt(qk_nope + qk_rope): the score scale of the unabsorbed heads, which absorption keeps (the YaRN
        mscale factor of long-context checkpoints is left out: it changes no cost)."""
        return (self.qk_nope_head_dim + self.qk_rope_head_dim) ** -0.5

    def kv_bytes_per_token(self, elem: int) -> int:
        """Cache bytes one token adds over all layers: one latent per layer."""
        return self.layers * self.latent_dim * elem


@dataclass(frozen=True)
class WindowPreset:
    """GQA whose layers alternate a sliding window with full attention, each head adding a learned sink logit to the
    softmax denominator (gpt-oss). `window_left` is FlashInfer's: sliding_window - 1 (the reference model masks keys
    j <= i - sliding_window, so a query sees itself and the sliding_window - 1 keys before it)."""

    name: str
    q_heads: int
    kv_heads: int
    head_dim: int
    sliding_window: int
    layers: int
    window_every: int = 2  # layer i slides when i % window_every == 0 (layer_types: sliding, full, sliding, ...)
    sinks: bool = True

    @property
    def window_left(self) -> int:
        return self.sliding_window - 1

    @property
    def window_layers(self) -> int:
        return len(range(0, self.layers, self.window_every))

    @property
    def full_layers(self) -> int:
        return self.layers - self.window_layers

    def kv_bytes_per_token(self, elem: int, context: int) -> float:
        """Cache bytes per token at `context` tokens, over all layers: full layers keep every token, window layers at
        most sliding_window of them (a server may keep the rest, but a step never reads them)."""
        kept = min(context, self.sliding_window) / max(context, 1)
        return 2 * self.kv_heads * self.head_dim * elem * (self.full_layers + self.window_layers * kept)


ATTENTION_PRESETS: dict[str, MLAPreset | WindowPreset] = {p.name: p for p in (
    # deepseek-ai/DeepSeek-V2-Lite and DeepSeek-V3 config.json: num_attention_heads, kv_lora_rank, qk_rope_head_dim,
    # qk_nope_head_dim, num_hidden_layers
    MLAPreset("deepseek-v2-lite", 16, 512, 64, 128, 27),
    MLAPreset("deepseek-v3", 128, 512, 64, 128, 61),
    # openai/gpt-oss-20b and -120b config.json: num_attention_heads, num_key_value_heads, head_dim, sliding_window,
    # num_hidden_layers; layer_types alternate sliding_attention and full_attention
    WindowPreset("gpt-oss-20b", 64, 8, 64, 128, 24),
    WindowPreset("gpt-oss-120b", 64, 8, 64, 128, 36),
)}


def attention_preset(name) -> MLAPreset | WindowPreset:
    try:
        return ATTENTION_PRESETS[name]
    except (KeyError, TypeError):
        raise ValueError(f"model: no attention preset {name!r}, choose from {', '.join(ATTENTION_PRESETS)}") from None


def mla_preset(name) -> MLAPreset:
    preset = attention_preset(name)
    if not isinstance(preset, MLAPreset):
        raise ValueError(f"model: {name!r} has no MLA attention (MLA presets: "
                         f"{', '.join(n for n, p in ATTENTION_PRESETS.items() if isinstance(p, MLAPreset))})")
    return preset


def window_preset(name) -> WindowPreset:
    preset = attention_preset(name)
    if not isinstance(preset, WindowPreset):
        raise ValueError(f"model: {name!r} has no sliding-window attention (window presets: "
                         f"{', '.join(n for n, p in ATTENTION_PRESETS.items() if isinstance(p, WindowPreset))})")
    return preset
