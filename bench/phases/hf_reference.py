"""A real model implementation as the phase model's second check: Hugging Face transformers' class of a model's kind
(Llama; Mixtral for a mixture of experts; DeepseekV2 or V3 for MLA; GptOss for sliding windows with sinks) at its dims,
random weights (nothing downloaded), a static (preallocated) KV cache as a server keeps it."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
from pathlib import Path

import torch

from ..spec.models import DecoderConfig
from .reference_decoder import ROPE_BASE

INSTALL = "pip install 'phasebench[reference]' (transformers)"


@contextlib.contextmanager
def _checkout_off_path():
    """Take the folders that hold this checkout's `kernels/` off sys.path: from a clone's root, `import kernels`
    finds phasebench's folder instead of the `kernels` package transformers probes for."""
    ours = Path(__file__).resolve().parents[2]
    hidden = [p for p in sys.path if Path(p or ".").resolve() == ours]
    sys.path[:] = [p for p in sys.path if p not in hidden]
    shadow = sys.modules.get("kernels")
    if shadow is not None and Path(getattr(shadow, "__file__", "") or "").resolve().is_relative_to(ours):
        del sys.modules["kernels"]
    else:
        shadow = None
    try:
        yield
    finally:
        sys.path[:0] = hidden
        if shadow is not None:
            sys.modules["kernels"] = shadow


def transformers_module():
    """transformers, or ImportError with one line saying how to install it."""
    try:
        with _checkout_off_path():
            module = importlib.import_module("transformers")
            importlib.import_module("transformers.models.llama.modeling_llama")
            return module
    except ImportError as err:
        raise ImportError(f"reference: transformers is not installed here ({INSTALL}): {err}") from None


def available() -> bool:
    try:
        transformers_module()
    except ImportError:
        return False
    return True


def architecture(tf, config: DecoderConfig) -> tuple[type, type, dict]:
    """(config class, model class, the fields beyond Llama's) of the transformers model with `config`'s layer: Llama
    for a dense GQA model, Mixtral for a mixture of experts, DeepseekV2 (a softmax's top k as it is) or DeepseekV3 (a
    sigmoid's) for MLA, GptOss for sliding windows with sinks (every layer a mixture); ValueError, with one line, for
    what none of them has, a router's included (Mixtral's and GptOss's renormalize a softmax's top k, unscaled)."""
    if config.attention == "mla":
        if config.is_moe and config.router_scoring == "sigmoid":
            return tf.DeepseekV3Config, tf.DeepseekV3ForCausalLM, deepseek_fields(config)
        if config.is_moe and config.router_renormalize:
            raise ValueError(f"reference: {config.name} renormalizes its router's softmax top k, which transformers' "
                             "DeepseekV2 never does (router_renormalize=0 is DeepSeek-V2's router, "
                             "router_scoring=sigmoid DeepSeek-V3's)")
        return tf.DeepseekV2Config, tf.DeepseekV2ForCausalLM, deepseek_fields(config)
    router = (config.router_scoring, config.router_renormalize, config.router_scale)
    if config.is_moe and router != ("softmax", True, 1.0):
        raise ValueError(f"reference: {config.name}'s router is not a softmax's top k renormalized and unscaled, which "
                         "transformers' Mixtral and GptOss route with")
    if config.attention == "window" or config.sinks:
        if not config.sinks or config.attention != "window" or not config.is_moe or config.shared_intermediate \
                or config.dense_layers:
            raise ValueError(f"reference: {config.name} is not a gpt-oss layer (a window with sinks on alternate "
                             "layers, routed experts alone in every layer), which transformers' GptOss needs")
        return tf.GptOssConfig, tf.GptOssForCausalLM, dict(
            num_local_experts=config.experts, num_experts_per_tok=config.top_k, sliding_window=config.sliding_window,
            layer_types=["sliding_attention" if config.layer_kind(i)[1] == "window" else "full_attention"
                         for i in range(config.layers)])
    if not config.is_moe:
        return tf.LlamaConfig, tf.LlamaForCausalLM, {}
    if config.shared_intermediate or config.dense_layers:
        raise ValueError(f"reference: {config.name} has shared experts or dense first layers, which transformers' "
                         "Mixtral has not")
    return tf.MixtralConfig, tf.MixtralForCausalLM, dict(num_local_experts=config.experts, router_jitter_noise=0.0,
                                                         num_experts_per_tok=config.top_k, sliding_window=None)


def deepseek_fields(config: DecoderConfig) -> dict:
    """DeepseekV2Config's or V3's fields beyond Llama's for an MLA model: its latent and head dims, and its mixture
    after its first dense layers (the router's renormalizing, read by V3 only, and routed_scaling_factor; one group,
    so that the top k is taken over every expert, as phasebench's router does), or dense layers throughout."""
    shared, width = divmod(config.shared_intermediate, config.intermediate)
    if width:
        raise ValueError(f"reference: {config.name}'s shared experts ({config.shared_intermediate}) are not a whole "
                         f"number of experts of {config.intermediate}, as DeepseekV2 builds them")
    mixture = dict(n_routed_experts=config.experts, num_experts_per_tok=config.top_k, n_shared_experts=shared,
                   moe_intermediate_size=config.intermediate, first_k_dense_replace=config.dense_layers,
                   intermediate_size=config.dense_intermediate or config.intermediate, topk_method="greedy",
                   n_group=1, topk_group=1, routed_scaling_factor=float(config.router_scale),
                   norm_topk_prob=config.router_renormalize) if config.is_moe \
        else dict(first_k_dense_replace=config.layers)
    # head_dim: the rotary dims, as both configs set it (Llama's field would give the value heads')
    return dict(kv_lora_rank=config.kv_lora_rank, q_lora_rank=config.q_lora_rank or None,
                head_dim=config.qk_rope_head_dim, qk_rope_head_dim=config.qk_rope_head_dim,
                qk_nope_head_dim=config.qk_nope_head_dim,
                v_head_dim=config.head_dim, num_key_value_heads=config.q_heads, **mixture)


class HFReference:
    """`layers` layers of the transformers model of `config`'s kind (architecture; a mixture's `experts`
    implementation or transformers' default) with `config`'s dims, fed hidden states (the embedding skipped, as the
    phasebench decoder does), the lm_head on each sequence's last token and a greedy pick; a StaticCache per shape,
    written in place at fixed positions, so every timed call does the same work. SDPA attention, or eager where the
    class has no SDPA path (GptOss: sinks)."""

    def __init__(self, config: DecoderConfig, layers: int, device, dtype: torch.dtype, seed: int = 0,
                 experts: str | None = None):
        tf = transformers_module()
        self.version, self.device, self.dtype = tf.__version__, torch.device(device), dtype
        with _checkout_off_path():  # the model's modules are imported on first use
            config_class, model_class, extra = architecture(tf, config)
        fields = dict(hidden_size=config.hidden, intermediate_size=config.intermediate, num_hidden_layers=layers,
                      num_attention_heads=config.q_heads, num_key_value_heads=config.kv_heads,
                      head_dim=config.head_dim, vocab_size=config.vocab, max_position_embeddings=1 << 20,
                      rms_norm_eps=1e-6, tie_word_embeddings=False)
        fields.update(extra)
        if "layer_types" in fields:
            fields["layer_types"] = fields["layer_types"][:layers]
        if experts:  # the experts implementation (transformers' default: grouped_mm, torch._grouped_mm)
            fields["experts_implementation"] = experts
        params = inspect.signature(config_class.__init__).parameters
        if "rope_parameters" in params:  # transformers 5
            fields["rope_parameters"] = {"rope_theta": ROPE_BASE, "rope_type": "default"}
        else:
            fields["rope_theta"] = ROPE_BASE
        self.config = config_class(**fields)
        self.config._attn_implementation = "sdpa" if model_class._supports_sdpa else "eager"
        torch.manual_seed(seed)
        with torch.device(self.device), _checkout_off_path():
            self.model = model_class(self.config).to(dtype).eval()
        self.experts = getattr(self.model.config, "_experts_implementation", None) if config.is_moe else None
        self._static_cache = tf.StaticCache
        self._cache_kw = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"
        self._caches: dict[tuple[int, int], object] = {}
        self._inputs: dict[tuple[int, int], torch.Tensor] = {}
        self.attention = self.config._attn_implementation

    @property
    def name(self) -> str:
        experts = f", experts {self.experts}" if self.experts else ""
        return f"transformers {self.version} {type(self.model).__name__} ({self.attention}{experts}, static cache)"

    def _cache(self, batch: int, tokens: int):
        """One cache at a time (a cache sizes itself to the batch of its first call)."""
        if (batch, tokens) not in self._caches:
            self._caches = {(batch, tokens): self._static_cache(config=self.config, max_cache_len=tokens)}
        return self._caches[batch, tokens]

    def _input(self, batch: int, tokens: int) -> torch.Tensor:
        key = (batch, tokens)
        if key not in self._inputs:
            gen = torch.Generator(device=self.device).manual_seed(2)
            x = torch.randn(batch, tokens, self.config.hidden_size, generator=gen, device=self.device)
            self._inputs = {key: x.to(self.dtype)}
        return self._inputs[key]

    @contextlib.contextmanager
    def _first_layers(self, depth: int | None):
        """Run only the first `depth` layers (their weights shared, nothing copied): LlamaModel runs
        `layers[:num_hidden_layers]`, so both are cut for the call and restored after it."""
        inner, count = self.model.model, self.config.num_hidden_layers
        if depth is None or depth == count:
            yield
            return
        if isinstance(depth, bool) or not isinstance(depth, int) or not 0 <= depth <= count:
            raise ValueError(f"depth: must be an int in 0..{count} (the layers built), got {depth!r}")
        layers = inner.layers
        inner.layers, self.config.num_hidden_layers = layers[:depth], depth
        try:
            yield
        finally:
            inner.layers, self.config.num_hidden_layers = layers, count

    def _step(self, batch: int, tokens: int, start: int, cache_len: int, depth: int | None) -> torch.Tensor:
        positions = torch.arange(start, start + tokens, device=self.device)
        cache = self._cache(batch, cache_len)  # made for every layer, before a depth cuts the config
        for layer in getattr(cache, "layers", ()):  # transformers 5 writes at the length it counts, not at
            length = getattr(layer, "cumulative_length", None)  # cache_position: every call starts at `start`
            if isinstance(length, torch.Tensor):
                length.fill_(start)
            if hasattr(layer, "cumulative_length_int"):  # a sliding-window layer's control flow counts in Python
                layer.cumulative_length_int = start
        with self._first_layers(depth):
            out = self.model(inputs_embeds=self._input(batch, tokens), cache_position=positions,
                             position_ids=positions.expand(batch, -1), use_cache=True, logits_to_keep=1,
                             **{self._cache_kw: cache})
        return out.logits[:, -1].argmax(-1)

    @torch.inference_mode()
    def prefill(self, batch: int, prompt_len: int, depth: int | None = None) -> torch.Tensor:
        """The prompt through every layer (the first `depth` only, where given) into a cache of prompt_len rows;
        ids [batch]."""
        return self._step(batch, prompt_len, 0, prompt_len, depth)

    @torch.inference_mode()
    def decode_step(self, batch: int, context: int, depth: int | None = None) -> torch.Tensor:
        """One new token per sequence at position `context`, into a cache of context + 1 rows (the first `depth`
        layers only, where given); ids [batch]."""
        return self._step(batch, 1, context, context + 1, depth)
