"""Decoder model presets from public configs (dense and mixture-of-experts), custom models, and the projections a
layer runs."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class DecoderConfig:
    """The shape of a decoder-only transformer: what its attention and its linear layers multiply. A mixture of
    experts (`experts` > 0) replaces the dense MLP with `experts` routed experts of `intermediate` each, `top_k` per
    token, a router (hidden -> experts) and, with `shared_intermediate`, shared experts: a dense MLP of that width
    that every token runs beside its routed ones. `not_composed` says why the phase model cannot compose a preset
    (its attention is not the GQA/MHA the attention operator measures); empty for those it can."""

    hidden: int
    intermediate: int
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    name: str = "custom"
    experts: int = 0
    top_k: int = 0
    shared_intermediate: int = 0
    not_composed: str = ""

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("name", "not_composed"):
                continue
            low = 0 if f.name in MOE_KEYS else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{f.name}: must be {'a non-negative' if low == 0 else 'a positive'} int, "
                                 f"got {value!r}")
        if self.q_heads % self.kv_heads:
            raise ValueError(f"q_heads: must be a multiple of kv_heads, got {self.q_heads} and {self.kv_heads}")
        if (self.experts > 0) != (self.top_k > 0) or self.top_k > self.experts:
            raise ValueError(f"top_k: a mixture of experts routes each token to 1..experts of them (and a dense model "
                             f"has neither), got top_k={self.top_k} with experts={self.experts}")
        if self.shared_intermediate and not self.experts:
            raise ValueError("shared_intermediate: shared experts need routed ones (experts > 0)")

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    def projections(self) -> dict[str, tuple[int, int]]:
        """(N, K) of each linear layer, output features by input features: fused qkv, o, fused gate_up and down (the
        dense MLP, or the shared experts of a mixture), the router (a mixture's), and the lm_head (once per step)."""
        d = self.head_dim
        out = {"qkv": ((self.q_heads + 2 * self.kv_heads) * d, self.hidden), "o": (self.hidden, self.q_heads * d)}
        mlp = self.shared_intermediate if self.is_moe else self.intermediate
        if mlp:
            out.update(gate_up=(2 * mlp, self.hidden), down=(self.hidden, mlp))
        if self.is_moe:
            out["router"] = (self.experts, self.hidden)
        out["lm_head"] = (self.vocab, self.hidden)
        return out

    def layer_weight_count(self) -> int:
        """Weights of one decoder layer's projections and routed experts (norms excluded)."""
        dense = sum(n * k for name, (n, k) in self.projections().items() if name != "lm_head")
        return dense + self.experts * 3 * self.intermediate * self.hidden


MOE_KEYS = ("experts", "top_k", "shared_intermediate")  # 0 for a dense model


# From the models' public config.json files (hidden_size, intermediate_size, num_hidden_layers,
# num_attention_heads, num_key_value_heads, head_dim, vocab_size).
MODELS: dict[str, DecoderConfig] = {
    "llama-3-8b": DecoderConfig(4096, 14336, 32, 32, 8, 128, 128256, "llama-3-8b"),
    "llama-3-70b": DecoderConfig(8192, 28672, 80, 64, 8, 128, 128256, "llama-3-70b"),
    "mistral-7b": DecoderConfig(4096, 14336, 32, 32, 8, 128, 32000, "mistral-7b"),
    "qwen2.5-7b": DecoderConfig(3584, 18944, 28, 28, 4, 128, 152064, "qwen2.5-7b"),
    "gemma-2-9b": DecoderConfig(3584, 14336, 42, 16, 8, 256, 256000, "gemma-2-9b"),
    "llama-2-7b": DecoderConfig(4096, 11008, 32, 32, 32, 128, 32000, "llama-2-7b"),
    # small models of the same families: the default drafts of speculative decoding (DRAFTS)
    "llama-3.2-1b": DecoderConfig(2048, 8192, 16, 32, 8, 64, 128256, "llama-3.2-1b"),
    "tinyllama-1.1b": DecoderConfig(2048, 5632, 22, 32, 4, 64, 32000, "tinyllama-1.1b"),
    "gemma-2-2b": DecoderConfig(2304, 9216, 26, 8, 4, 256, 256000, "gemma-2-2b"),
    # mixtures of experts (intermediate: each routed expert's; num_local_experts or num_experts or n_routed_experts,
    # num_experts_per_tok, moe_intermediate_size, n_shared_experts x moe_intermediate_size)
    "mixtral-8x7b": DecoderConfig(4096, 14336, 32, 32, 8, 128, 32000, "mixtral-8x7b", experts=8, top_k=2),
    "qwen3-30b-a3b": DecoderConfig(2048, 768, 48, 32, 4, 128, 151936, "qwen3-30b-a3b", experts=128, top_k=8),
    # layer 0 of 27 is a dense MLP of 10944 (first_k_dense_replace 1); MLA attention: q heads of 128 + 64 rotary dims
    # against a 512-wide latent, v heads of 128 (head_dim here)
    "deepseek-v2-lite": DecoderConfig(2048, 1408, 27, 16, 16, 128, 102400, "deepseek-v2-lite", experts=64, top_k=6,
                                      shared_intermediate=2 * 1408, not_composed=(
                                          "its attention is MLA (a 512-wide compressed KV latent), which the attention "
                                          "operator does not measure, and its first layer is dense")),
    "gpt-oss-20b": DecoderConfig(2880, 2880, 24, 64, 8, 64, 201088, "gpt-oss-20b", experts=32, top_k=4, not_composed=(
        "every other layer attends a 128-token sliding window and every head adds a sink, and its experts have biases "
        "and a clamped SwiGLU: the attention and moe operators measure neither")),
}
# target -> its default draft: a small model of the same family and tokenizer
DRAFTS = {"llama-3-8b": "llama-3.2-1b", "llama-3-70b": "llama-3-8b", "llama-2-7b": "tinyllama-1.1b",
          "gemma-2-9b": "gemma-2-2b"}
CONFIG_KEYS = tuple(f.name for f in fields(DecoderConfig) if f.name != "not_composed")


def key_values(text: str, keys, what: str) -> dict[str, str]:
    """`a=1,b=x` as a dict, each key one of `keys`; a one-line ValueError led by `what` otherwise."""
    values: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key not in keys or not value:
            raise ValueError(f"{what}: malformed {part!r} in {text!r}; expected key=value with keys {', '.join(keys)}")
        values[key] = value
    return values


def parse_model(text: str) -> DecoderConfig:
    """A custom model from `name=tiny,hidden=512,intermediate=1536,layers=4,q_heads=8,kv_heads=2,head_dim=64,
    vocab=32000` (every key but name and the mixture's required); a mixture of experts adds `experts=E,top_k=K`
    (intermediate is then each expert's) and, for shared experts, `shared_intermediate=S`."""
    values: dict = {}
    for key, value in key_values(text, CONFIG_KEYS, "model").items():
        if key == "name":
            values[key] = value
            continue
        try:
            values[key] = int(value)
        except ValueError:
            raise ValueError(f"model: {key} must be an integer, got {value!r}") from None
    missing = [k for k in CONFIG_KEYS if k != "name" and k not in MOE_KEYS and k not in values]
    if missing:
        raise ValueError(f"model: {text!r} lacks {', '.join(missing)}")
    return DecoderConfig(**values)


def model_config(spec) -> DecoderConfig:
    """A preset by name, a DecoderConfig as it is, or a custom `key=value,...` spec (registered under its name)."""
    if isinstance(spec, DecoderConfig):
        return spec
    if not isinstance(spec, str):
        raise ValueError(f"model: expected a preset name, a key=value spec or a DecoderConfig, got {spec!r}")
    if "=" in spec:
        config = parse_model(spec)
        return register_model(config)
    if spec not in MODELS:
        raise ValueError(f"model: unknown model {spec!r}, choose from {', '.join(MODELS)} or give key=value,...")
    return MODELS[spec]


def register_model(config: DecoderConfig) -> DecoderConfig:
    """Make a custom model usable by name in this process (suites, --model)."""
    known = MODELS.get(config.name)
    if known is not None and known != config:
        raise ValueError(f"model: {config.name!r} is already a different model; give the custom one another name")
    MODELS[config.name] = config
    return config


def model_weight_count(config: DecoderConfig) -> int:
    """Weights of every layer's projections and the lm_head: what one decode step streams."""
    return config.layers * config.layer_weight_count() + config.vocab * config.hidden


def draft_config(target: DecoderConfig, spec=None) -> DecoderConfig:
    """The draft model of speculative decoding for `target`: `spec` (a preset, a key=value spec or a config) or the
    target's default (DRAFTS); one-line ValueError for a draft of another vocabulary or not smaller than the
    target."""
    if spec is None:
        if target.name not in DRAFTS:
            raise ValueError(f"draft: no default draft for {target.name!r} (defaults: "
                             f"{', '.join(f'{t} -> {d}' for t, d in DRAFTS.items())}); give --draft")
        spec = DRAFTS[target.name]
    try:
        draft = model_config(spec)
    except ValueError as err:
        raise ValueError(f"draft: {str(err).removeprefix('model: ')}") from None
    if draft.vocab != target.vocab:
        raise ValueError(f"draft: {draft.name} has a vocabulary of {draft.vocab}, {target.name} of {target.vocab}; "
                         "a draft proposes the target's tokens")
    if model_weight_count(draft) >= model_weight_count(target):
        raise ValueError(f"draft: {draft.name} ({model_weight_count(draft) / 1e9:.2f}B weights) is not smaller than "
                         f"{target.name} ({model_weight_count(target) / 1e9:.2f}B)")
    return draft
