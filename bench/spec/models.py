"""Decoder model presets from public configs (dense, mixture-of-experts, MLA and sliding-window attention), custom
models, the projections a layer runs and the KV cache a token costs."""

from __future__ import annotations

from dataclasses import dataclass, fields

ATTENTION_KINDS = ("gqa", "mla", "window")
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}  # an activation dtype's element, for the KV cache's bytes
WINDOW_EVERY = 2  # a sliding-window model's layer i slides when i % 2 == 0 (gpt-oss's layer_types: sliding, full, ...)
ROUTER_SCORINGS = ("softmax", "sigmoid")  # kernels.moe's route takes these


@dataclass(frozen=True)
class DecoderConfig:
    """The shape of a decoder-only transformer: what its attention and its linear layers multiply.

    A mixture of experts (`experts` > 0) replaces the dense MLP with `experts` routed experts of `intermediate` each,
    `top_k` per token, a router (hidden -> experts) and, with `shared_intermediate`, shared experts: a dense MLP of
    that width every token runs beside its routed ones; its first `dense_layers` layers keep a dense MLP of
    `dense_intermediate` (DeepSeek's first_k_dense_replace and intermediate_size). The router scores every expert
    (`router_scoring`: a softmax over them, or a sigmoid of each logit), keeps the top_k, divides their weights by
    their sum with `router_renormalize`, then multiplies them by `router_scale` (kernels.moe's `route`). Group-limited
    selection (DeepSeek-V3's noaux_tc: the best groups of experts first, a correction bias on the scores) is not
    modelled: the top_k of every expert. Both scorings rank the experts as the logits do, so they choose the same
    experts; the weights change what a step computes, not what it reads. The phase model draws the experts a step
    touches apart from any router (uniformly, as a random router's top k falls): it assumes a real router's choices
    over a batch are about as spread, which a group limit (each token within 4 of DeepSeek-V3's 8 groups) need not be.

    The attention is GQA over a full cache, or one of two other kinds:
    - MLA (`kv_lora_rank` > 0, DeepSeek): each token caches one latent of kv_lora_rank + qk_rope_head_dim dims shared
      by every head; the query heads have qk_nope_head_dim + qk_rope_head_dim dims (through a q_lora_rank down
      projection where q_lora_rank > 0) and the value heads `head_dim` (v_head_dim); kv_heads is unused.
    - sliding windows (`sliding_window` > 0, gpt-oss): layer i attends the last sliding_window tokens when
      i % WINDOW_EVERY == 0, every token otherwise; `sinks`: every head adds a learned logit to the softmax
      denominator (on any GQA model)."""

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
    dense_layers: int = 0
    dense_intermediate: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    q_lora_rank: int = 0
    sliding_window: int = 0
    sinks: bool = False
    router_scoring: str = "softmax"
    router_renormalize: bool = True
    router_scale: float = 1.0

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in NON_INT_KEYS:
                continue
            low = 0 if f.name in OPTIONAL_KEYS else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{f.name}: must be {'a non-negative' if low == 0 else 'a positive'} int, "
                                 f"got {value!r}")
        for name in ("sinks", "router_renormalize"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: must be a bool, got {getattr(self, name)!r}")
        if self.router_scoring not in ROUTER_SCORINGS:
            raise ValueError(f"router_scoring: must be one of {', '.join(ROUTER_SCORINGS)}, got "
                             f"{self.router_scoring!r}")
        scale = self.router_scale
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale < float("inf"):
            raise ValueError(f"router_scale: must be a positive finite number, got {scale!r}")
        if self.q_heads % self.kv_heads:
            raise ValueError(f"q_heads: must be a multiple of kv_heads, got {self.q_heads} and {self.kv_heads}")
        if (self.experts > 0) != (self.top_k > 0) or self.top_k > self.experts:
            raise ValueError(f"top_k: a mixture of experts routes each token to 1..experts of them (and a dense model "
                             f"has neither), got top_k={self.top_k} with experts={self.experts}")
        if self.shared_intermediate and not self.experts:
            raise ValueError("shared_intermediate: shared experts need routed ones (experts > 0)")
        if (self.dense_layers > 0) != (self.dense_intermediate > 0) or (self.dense_layers and not self.experts):
            raise ValueError(f"dense_layers: a mixture's first dense layers need their MLP width (dense_intermediate) "
                             f"and routed experts after them, got dense_layers={self.dense_layers}, "
                             f"dense_intermediate={self.dense_intermediate}, experts={self.experts}")
        self._check_attention()

    def _check_attention(self):
        mla = (self.kv_lora_rank, self.qk_rope_head_dim, self.qk_nope_head_dim)
        if any(mla) or self.q_lora_rank:
            if not all(mla):
                raise ValueError(f"kv_lora_rank: MLA needs kv_lora_rank, qk_rope_head_dim and qk_nope_head_dim, got "
                                 f"{mla}")
            if self.qk_rope_head_dim % 2 or self.kv_lora_rank % 2:
                raise ValueError(f"qk_rope_head_dim: MLA's rotary dims and its latent must be even (rotate-half; the "
                                 f"latent is appended as two halves), got {self.qk_rope_head_dim} and "
                                 f"{self.kv_lora_rank}")
            if self.sliding_window or self.sinks:
                raise ValueError("sliding_window: an MLA model attends its whole latent cache (no window, no sinks)")

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def attention(self) -> str:
        """The attention kind: "mla", "window" (sliding-window layers alternating with full ones) or "gqa"."""
        return "mla" if self.kv_lora_rank else "window" if self.sliding_window else "gqa"

    @property
    def latent_dim(self) -> int:
        """MLA: the cached latent per token and layer, and the head dim decode attends with (576 for DeepSeek)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def qk_head_dim(self) -> int:
        """The dims of a query (and a decompressed key) head: MLA's qk_nope + qk_rope, head_dim otherwise."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.attention == "mla" else self.head_dim

    @property
    def softmax_scale(self) -> float:
        """1/sqrt(the query head's dims), which MLA's absorbed decode keeps (the YaRN mscale of long-context
        checkpoints is left out: it changes no cost)."""
        return self.qk_head_dim ** -0.5

    @property
    def window_left(self) -> int:
        """FlashInfer's window of a sliding layer: sliding_window - 1 (a query sees itself and the keys before it
        inside the window, as the reference implementations mask it); -1 without a window."""
        return self.sliding_window - 1 if self.sliding_window else -1

    def layer_kind(self, index: int) -> tuple[str, str]:
        """(MLP, attention) of layer `index`: ("dense" or "moe", "full" or "window")."""
        mlp = "moe" if self.is_moe and index >= self.dense_layers else "dense"
        window = self.sliding_window and index % WINDOW_EVERY == 0
        return mlp, "window" if window else "full"

    def layer_groups(self, layers: int | None = None) -> dict[tuple[str, str], int]:
        """How many of the first `layers` (default all) layers run each kind, in the order they first appear."""
        groups: dict[tuple[str, str], int] = {}
        for index in range(self.layers if layers is None else layers):
            kind = self.layer_kind(index)
            groups[kind] = groups.get(kind, 0) + 1
        return groups

    @property
    def window_layers(self) -> int:
        return sum(n for (_, attention), n in self.layer_groups().items() if attention == "window")

    def projections(self) -> dict[str, tuple[int, int]]:
        """(N, K) of each linear layer, output features by input features. GQA: fused qkv and o; MLA: q_kv_a (the
        query, or its q_lora down projection, fused with the latent's kv_a down projection), q_b (the query's up
        projection, with q_lora_rank), kv_b (the latent's up projection to every head's key and value: prefill),
        q_absorb and v_up (kv_b's key and value halves absorbed into the query and out of the output: decode) and
        o; then the MLP's fused gate_up and down (the dense MLP, or a mixture's shared experts), a mixture's
        dense_gate_up / dense_down (its first dense layers), router and one routed expert's expert_gate_up /
        expert_down (the moe operator's matrices, for sweeps of one expert's GEMV), and the lm_head (once per
        step)."""
        d, h = self.head_dim, self.q_heads
        if self.attention == "mla":
            query = h * self.qk_head_dim
            out = {"q_kv_a": ((self.q_lora_rank or query) + self.latent_dim, self.hidden)}
            if self.q_lora_rank:
                out["q_b"] = (query, self.q_lora_rank)
            out.update(kv_b=(h * (self.qk_nope_head_dim + d), self.kv_lora_rank),
                       q_absorb=(h * self.kv_lora_rank, self.qk_nope_head_dim), v_up=(h * d, self.kv_lora_rank),
                       o=(self.hidden, h * d))
        else:
            out = {"qkv": ((h + 2 * self.kv_heads) * d, self.hidden), "o": (self.hidden, h * d)}
        mlp = self.shared_intermediate if self.is_moe else self.intermediate
        if mlp:
            out.update(gate_up=(2 * mlp, self.hidden), down=(self.hidden, mlp))
        if self.dense_layers:
            out.update(dense_gate_up=(2 * self.dense_intermediate, self.hidden),
                       dense_down=(self.hidden, self.dense_intermediate))
        if self.is_moe:
            out.update(router=(self.experts, self.hidden), expert_gate_up=(2 * self.intermediate, self.hidden),
                       expert_down=(self.hidden, self.intermediate))
        out["lm_head"] = (self.vocab, self.hidden)
        return out

    def layer_weight_count(self, index: int | None = None) -> int:
        """Weights of layer `index`'s projections and routed experts (norms and sinks excluded; MLA's absorbed
        projections are views of kv_b, counted once); default the last layer (a routed one in a mixture)."""
        mlp, _ = self.layer_kind(self.layers - 1 if index is None else index)
        skip = {"lm_head", "q_absorb", "v_up", "expert_gate_up", "expert_down"}  # experts: counted below
        skip |= {"dense_gate_up", "dense_down"} if mlp == "moe" else {"router", "gate_up", "down"} if self.is_moe \
            else set()
        dense = sum(n * k for name, (n, k) in self.projections().items() if name not in skip)
        return dense + (self.experts * 3 * self.intermediate * self.hidden if mlp == "moe" else 0)

    def layers_weight_count(self, layers: int | None = None) -> int:
        """Weights of the first `layers` layers (default all), each by its kind."""
        return sum(self.layer_weight_count(i) for i in range(self.layers if layers is None else layers))

    def kv_bytes_per_token(self, elem: int, context: int) -> float:
        """KV-cache bytes one token costs over every layer at `context` tokens: GQA a K and a V head of each kv head;
        MLA one latent; a window layer keeps at most sliding_window tokens (a server may keep more, a step never
        reads them), so its share per token falls as the context grows past the window."""
        if self.attention == "mla":
            return float(self.layers * self.latent_dim * elem)
        per_layer = 2 * self.kv_heads * self.head_dim * elem
        windows = self.window_layers
        kept = min(context, self.sliding_window) / max(context, 1) if windows else 0.0
        return per_layer * (self.layers - windows + windows * kept)


OPTIONAL_KEYS = ("experts", "top_k", "shared_intermediate", "dense_layers", "dense_intermediate", "kv_lora_rank",
                 "qk_rope_head_dim", "qk_nope_head_dim", "q_lora_rank", "sliding_window")  # 0 where unused
NON_INT_KEYS = ("name", "sinks", "router_scoring", "router_renormalize", "router_scale")


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
    # num_experts_per_tok, moe_intermediate_size, n_shared_experts x moe_intermediate_size). The router_* fields
    # default to a softmax's top k renormalized: Qwen3-MoE's norm_topk_prob true, and Mixtral's and gpt-oss's
    # reference code (a softmax over the top k logits, the same); DeepSeek's come from its config.json below
    "mixtral-8x7b": DecoderConfig(4096, 14336, 32, 32, 8, 128, 32000, "mixtral-8x7b", experts=8, top_k=2),
    "qwen3-30b-a3b": DecoderConfig(2048, 768, 48, 32, 4, 128, 151936, "qwen3-30b-a3b", experts=128, top_k=8),
    # MLA (deepseek-ai/DeepSeek-V2-Lite and DeepSeek-V3 config.json): head_dim is v_head_dim; num_key_value_heads
    # (= num_attention_heads) is unused; dense_layers / dense_intermediate are first_k_dense_replace and
    # intermediate_size, intermediate is moe_intermediate_size, shared_intermediate n_shared_experts x that.
    # V2-Lite's router: scoring_func softmax, topk_method greedy, norm_topk_prob false, routed_scaling_factor 1.0
    "deepseek-v2-lite": DecoderConfig(2048, 1408, 27, 16, 16, 128, 102400, "deepseek-v2-lite", experts=64, top_k=6,
                                      shared_intermediate=2 * 1408, dense_layers=1, dense_intermediate=10944,
                                      kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
                                      router_renormalize=False, router_scale=1.0),
    # DeepSeek-V3's router: scoring_func sigmoid, norm_topk_prob true, routed_scaling_factor 2.5; its topk_method
    # noaux_tc (the experts of the best topk_group 4 of n_group 8 groups, a correction bias on the scores) is left
    # out: the top 8 of all 256 experts
    "deepseek-v3": DecoderConfig(7168, 2048, 61, 128, 128, 128, 129280, "deepseek-v3", experts=256, top_k=8,
                                 shared_intermediate=2048, dense_layers=3, dense_intermediate=18432, kv_lora_rank=512,
                                 qk_rope_head_dim=64, qk_nope_head_dim=128, q_lora_rank=1536,
                                 router_scoring="sigmoid", router_scale=2.5),
    # sliding windows with sinks (openai/gpt-oss-20b and -120b config.json: sliding_window, layer_types alternating
    # sliding_attention and full_attention, num_local_experts, num_experts_per_tok; the experts' biases and clamped
    # SwiGLU are left to the moe rows' plain SwiGLU, which costs the same reads)
    "gpt-oss-20b": DecoderConfig(2880, 2880, 24, 64, 8, 64, 201088, "gpt-oss-20b", experts=32, top_k=4,
                                 sliding_window=128, sinks=True),
    "gpt-oss-120b": DecoderConfig(2880, 2880, 36, 64, 8, 64, 201088, "gpt-oss-120b", experts=128, top_k=4,
                                  sliding_window=128, sinks=True),
}
# target -> its default draft: a small model of the same family and tokenizer
DRAFTS = {"llama-3-8b": "llama-3.2-1b", "llama-3-70b": "llama-3-8b", "llama-2-7b": "tinyllama-1.1b",
          "gemma-2-9b": "gemma-2-2b"}
CONFIG_KEYS = tuple(f.name for f in fields(DecoderConfig))
REQUIRED_KEYS = CONFIG_KEYS[:7]


def config_from_dict(values: dict) -> DecoderConfig:
    """A DecoderConfig from its fields (a phases.json's "model"), keys it no longer has left out."""
    return DecoderConfig(**{k: v for k, v in values.items() if k in CONFIG_KEYS})


def models_of_kind(attention: str) -> dict[str, DecoderConfig]:
    """The presets (and models registered in this process) whose attention is of that kind."""
    return {name: m for name, m in MODELS.items() if m.attention == attention}


def kind_config(spec, attention: str) -> DecoderConfig:
    """A model (model_config's spec) whose attention is of the kind (the mla-decode / window suites' models); a
    one-line ValueError naming the presets of that kind otherwise."""
    config = model_config(spec)
    if config.attention != attention:
        raise ValueError(f"model: {config.name!r} has {config.attention.upper()} attention, not "
                         f"{attention.upper()} ({attention.upper()} presets: "
                         f"{', '.join(models_of_kind(attention))})")
    return config


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
    vocab=32000` (every key but name and the optional ones required); a mixture of experts adds `experts=E,top_k=K`
    (intermediate is then each expert's) and its router where it is not a softmax's top k renormalized
    (`router_scoring=sigmoid`, `router_renormalize=0`, `router_scale=2.5`), for shared experts
    `shared_intermediate=S`, for first dense layers `dense_layers=D,dense_intermediate=I`; MLA
    `kv_lora_rank=R,qk_rope_head_dim=P,qk_nope_head_dim=N[,q_lora_rank=Q]` (head_dim is the value heads'); sliding
    windows `sliding_window=W` and sinks `sinks=1`."""
    values = {key: _spec_value(key, value) for key, value in key_values(text, CONFIG_KEYS, "model").items()}
    missing = [k for k in REQUIRED_KEYS if k != "name" and k not in values]
    if missing:
        raise ValueError(f"model: {text!r} lacks {', '.join(missing)}")
    return DecoderConfig(**values)


def _spec_value(key: str, value: str):
    """One value of a model spec, typed as its field (DecoderConfig checks its range)."""
    if key in ("name", "router_scoring"):
        return value
    if key in ("sinks", "router_renormalize"):
        if value.lower() not in ("1", "0", "true", "false"):
            raise ValueError(f"model: {key} must be 0/1/true/false, got {value!r}")
        return value.lower() in ("1", "true")
    try:
        return float(value) if key == "router_scale" else int(value)
    except ValueError:
        raise ValueError(f"model: {key} must be {'a number' if key == 'router_scale' else 'an integer'}, "
                         f"got {value!r}") from None


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
    """Weights of every layer's projections and routed experts and the lm_head."""
    return config.layers_weight_count() + config.vocab * config.hidden


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
