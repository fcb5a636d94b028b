"""A plain-PyTorch decoder of a model's dimensions: timed end to end, and traced for the ops one layer runs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ...kernels import qlinear, quantize
from ..instruments.timing import TimerConfig, Timing, time_call
from ..spec.models import DecoderConfig
from ..spec.steps import KEPT_FLOAT
from .attention_blocks import Attention, MLAAttention, RMSNorm, rotary, rotate_half, sdpa_has_gqa  # noqa: F401
from .moe_block import MoeBlock, experts_op, mlp_projections
from .moe_block import bare_linear as _linear

ROPE_BASE = 500000.0
HOST_LAYERS = 2  # llama-3-8b at 2 layers in float32: ~1.7 GiB of layer weights (+2 GiB lm_head) on a 24 GiB host
DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


class Greedy(nn.Module):
    """The greedy pick: argmax over the vocabulary."""

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.argmax(-1)


class QuantizedLinear(nn.Module):
    """A projection whose weight is packed by a scheme (kernels.quantize), multiplied by kernels.qlinear's `impl`."""

    def __init__(self, weight: torch.Tensor, scheme: str, impl: str):
        super().__init__()
        self.qweight, self.impl = quantize(weight, scheme), impl

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = qlinear(x.reshape(-1, x.shape[-1]), self.qweight, impl=self.impl)
        return out.view(*x.shape[:-1], out.shape[-1])


def rope_tables(positions: int, head_dim: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [positions, head_dim] of the rotate-half rotary embedding, computed in float64."""
    inv_freq = ROPE_BASE ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(positions, dtype=torch.float64), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(device=device, dtype=dtype), angles.sin().to(device=device, dtype=dtype)


class DecoderLayer(nn.Module):
    """Pre-norm attention (GQA, a window and sinks where the layer has them, or MLA) and SwiGLU MLP (or MoeBlock)
    blocks with residual adds, and this layer's KV cache (MLA's latent cache lives in its block)."""

    def __init__(self, config: DecoderConfig, max_batch: int, max_tokens: int, device, dtype, moe_impl="torch",
                 index: int = 0, impls: dict | None = None):
        super().__init__()
        c, d, impls = config, config.head_dim, impls or {}
        mlp, kind = c.layer_kind(index)
        self.attn_norm = RMSNorm(c.hidden, device, dtype)
        self.mla = MLAAttention(c, max_batch, max_tokens, device, dtype, impls.get("mla", "torch")) \
            if c.attention == "mla" else None
        if self.mla is None:
            self.q_heads, self.kv_heads, self.head_dim = c.q_heads, c.kv_heads, d
            self.qkv = _linear(c.hidden, (c.q_heads + 2 * c.kv_heads) * d, device, dtype)
            self.attention = Attention(c.window_left if kind == "window" else -1, c.q_heads if c.sinks else 0,
                                       impls.get("attention", "flash"), device)
            self.o = _linear(c.q_heads * d, c.hidden, device, dtype)
            cache_shape = (max_batch, c.kv_heads, max_tokens, d)
            self.register_buffer("k_cache", torch.empty(cache_shape, device=device, dtype=dtype))
            self.register_buffer("v_cache", torch.empty(cache_shape, device=device, dtype=dtype))
        self.mlp_norm = RMSNorm(c.hidden, device, dtype)
        self.mixture = MoeBlock(c, device, dtype, moe_impl) if mlp == "moe" else None
        # a mixture's MLP lives in MoeBlock; its first dense layers have their own width and names (dense_gate_up)
        self.mlp_names = ("dense_gate_up", "dense_down") if c.is_moe else ("gate_up", "down")
        if mlp == "dense":
            width = c.dense_intermediate if c.is_moe else c.intermediate
            setattr(self, self.mlp_names[0], _linear(c.hidden, 2 * width, device, dtype))
            setattr(self, self.mlp_names[1], _linear(width, c.hidden, device, dtype))

    def forward(self, x: torch.Tensor, start: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.mla is not None:
            x = x + self.mla(self.attn_norm(x), start, cos, sin)
        else:
            x = x + self._gqa(self.attn_norm(x), start, cos, sin)
        if self.mixture is not None:
            return x + self.mixture(self.mlp_norm(x))
        gate_up, down = (getattr(self, name) for name in self.mlp_names)
        gate, up = gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + down(F.silu(gate) * up)

    def _gqa(self, x: torch.Tensor, start: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        hq, hkv, d = self.q_heads, self.kv_heads, self.head_dim
        q, k, v = self.qkv(x).split((hq * d, hkv * d, hkv * d), dim=-1)
        cos, sin = cos[start:start + t], sin[start:start + t]
        q = rotary(q.view(b, t, hq, d).transpose(1, 2), cos, sin)
        k = rotary(k.view(b, t, hkv, d).transpose(1, 2), cos, sin)
        end = start + t
        self.k_cache[:b, :, start:end] = k
        self.v_cache[:b, :, start:end] = v.view(b, t, hkv, d).transpose(1, 2)
        attn = self.attention(q, self.k_cache[:b, :, :end], self.v_cache[:b, :, :end], t > 1)
        return self.o(attn.transpose(1, 2).reshape(b, t, hq * d))


class ReferenceDecoder(nn.Module):
    """`layers` decoder layers of `config`'s dimensions with seeded random weights (the layers' projections packed
    by the `weights` scheme when given, run by qlinear's `weights_impl`, less the router and MLA's kv_b; a
    mixture's routed experts packed by `experts`, run by `moe_impl`), a final norm, the lm_head and a greedy
    pick. The token embedding is skipped: the input is seeded random hidden states [B, T, hidden]. `impls`: the
    attention impl of window and sink layers and the mla impl of MLA's decode (the composition's).
    device='meta' builds it without memory, for tracing shapes."""

    def __init__(self, config: DecoderConfig, layers: int, device, dtype: torch.dtype, max_tokens: int,
                 max_batch: int, seed: int = 0, weights: str = "", weights_impl: str = "torch", moe_impl="torch",
                 impls: dict | None = None, experts: str = ""):
        super().__init__()
        if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= config.layers:
            raise ValueError(f"layers: must be an int in 1..{config.layers} for {config.name}, got {layers!r}")
        for name, value in (("max_tokens", max_tokens), ("max_batch", max_batch)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be a positive int, got {value!r}")
        if dtype not in DTYPES:
            raise ValueError(f"dtype: must be one of {', '.join(map(str, DTYPES))}, got {dtype!r}")
        self.config, self.dtype, self.device = config, dtype, torch.device(device)
        self.max_tokens, self.max_batch, self.seed = max_tokens, max_batch, seed
        self.layers = nn.ModuleList(DecoderLayer(config, max_batch, max_tokens, self.device, dtype, moe_impl, i, impls)
                                    for i in range(layers))
        self.final_norm = RMSNorm(config.hidden, self.device, dtype)
        self.lm_head = _linear(config.hidden, config.vocab, self.device, dtype)
        self.greedy = Greedy()
        rope = config.qk_rope_head_dim if config.attention == "mla" else config.head_dim
        self.cos, self.sin = rope_tables(max_tokens, rope, self.device, dtype)
        self._cache_filled = False
        self._inputs: dict[tuple[int, int], torch.Tensor] = {}
        self._init_weights()
        for layer in self.layers:  # packed as the composition packs them (the lm_head stays: bench.spec.steps)
            if weights:
                for parent in (layer, layer.mla, layer.mixture):
                    for name, module in list(getattr(parent, "_modules", {}).items()):
                        if isinstance(module, nn.Linear) and name not in KEPT_FLOAT:
                            setattr(parent, name, QuantizedLinear(module.weight, weights, weights_impl))
            if experts and layer.mixture is not None:
                layer.mixture.pack(experts)

    @property
    def is_meta(self) -> bool:
        return self.device.type == "meta"

    def _generator(self, offset: int) -> torch.Generator | None:
        if self.is_meta:
            return None
        return torch.Generator(device=self.device).manual_seed(self.seed * 1000003 + offset)

    def _fill_random(self, out: torch.Tensor, std: float, gen, mean: float = 0.0) -> torch.Tensor:
        """Normal values drawn in float32 (cast into `out` otherwise), so every dtype rounds the same draw;
        drawn in place where out is float32, as a 2nd copy and its page faults cost seconds on the host."""
        if self.is_meta:
            return out
        if out.dtype == torch.float32:
            return out.normal_(mean, std, generator=gen)
        return out.copy_(torch.empty(out.shape, device=out.device).normal_(mean, std, generator=gen))

    @torch.no_grad()
    def _init_weights(self):
        gen = self._generator(0)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                self._fill_random(module.weight, module.in_features ** -0.5, gen)
            elif isinstance(module, RMSNorm):
                self._fill_random(module.weight, 0.1, gen, mean=1.0)
            elif isinstance(module, MoeBlock):
                module.fill(self._fill_random, gen)
            elif isinstance(module, Attention) and module.sinks is not None:
                self._fill_random(module.sinks, 1.0, gen)

    def _fill_cache(self):
        """Seeded random keys and values in every cache row, once, so decode needs no prefill before it."""
        if self._cache_filled or self.is_meta:
            return
        gen = self._generator(1)
        for layer in self.layers:
            for cache in (layer.mla.latent_cache,) if layer.mla is not None else (layer.k_cache, layer.v_cache):
                self._fill_random(cache, 1.0, gen)
        self._cache_filled = True

    def _input(self, batch: int, tokens: int) -> torch.Tensor:
        """Seeded random hidden states [batch, tokens, hidden] in place of the embedding (kept per shape)."""
        key = (batch, tokens)
        if key not in self._inputs:
            x = torch.empty(batch, tokens, self.config.hidden, device=self.device, dtype=self.dtype)
            self._inputs = {key: self._fill_random(x, 1.0, self._generator(2))}
        return self._inputs[key]

    def _check(self, batch: int, tokens: int, what: str, x: torch.Tensor | None):
        if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= self.max_batch:
            raise ValueError(f"batch: must be an int in 1..{self.max_batch} (max_batch), got {batch!r}")
        if tokens > self.max_tokens:
            raise ValueError(f"{what}: needs {tokens} cache rows, more than max_tokens={self.max_tokens}")
        shape = (batch, tokens if what == "prompt_len" else 1, self.config.hidden)
        if x is not None and tuple(x.shape) != shape:
            raise ValueError(f"x: expected shape {list(shape)}, got {list(x.shape)}")

    def _run(self, x: torch.Tensor, start: int, return_hidden: bool, depth: int | None, every_position=False):
        if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int)
                                  or not 0 <= depth <= len(self.layers)):
            raise ValueError(f"depth: must be an int in 0..{len(self.layers)} (the layers built), got {depth!r}")
        self._fill_cache()
        h = x
        for layer in self.layers[:depth]:
            h = layer(h, start, self.cos, self.sin)
        ids = self.greedy(self.lm_head(self.final_norm(h if every_position else h[:, -1])))
        return (ids, h) if return_hidden else ids

    @torch.inference_mode()
    def prefill(self, batch: int, prompt_len: int, x: torch.Tensor | None = None, return_hidden: bool = False,
                depth: int | None = None):
        """The prompt through every layer (causal), cache rows 0..prompt_len-1 filled, the lm_head on each
        sequence's last token only and the greedy pick: ids [batch]; with return_hidden also the last
        layer's output [batch, prompt_len, hidden] (before the final norm). x: the input, random by default;
        depth: run only the first `depth` layers (the head still runs)."""
        if isinstance(prompt_len, bool) or not isinstance(prompt_len, int) or prompt_len < 1:
            raise ValueError(f"prompt_len: must be a positive int, got {prompt_len!r}")
        self._check(batch, prompt_len, "prompt_len", x)
        return self._run(self._input(batch, prompt_len) if x is None else x, 0, return_hidden, depth)

    @torch.inference_mode()
    def decode_step(self, batch: int, context: int, x: torch.Tensor | None = None, return_hidden: bool = False,
                    depth: int | None = None):
        """One new token per sequence at position `context`, attending to the `context` cached tokens and
        itself; the cache holds whatever was last written there (seeded random values if nothing was).
        Returns ids [batch]; with return_hidden also the last layer's output [batch, 1, hidden]; depth as in
        prefill."""
        if isinstance(context, bool) or not isinstance(context, int) or context < 0:
            raise ValueError(f"context: must be a non-negative int, got {context!r}")
        self._check(batch, context + 1, "context", x)
        return self._run(self._input(batch, 1) if x is None else x, context, return_hidden, depth)

    @torch.inference_mode()
    def extend(self, batch: int, start: int, tokens: int, x: torch.Tensor | None = None, every_position: bool = False,
               return_hidden: bool = False, depth: int | None = None):
        """`tokens` new tokens per sequence at positions start..start+tokens-1 (a chunk of a prompt at a prefix
        offset, or a verify pass), attending to the `start` cached tokens and causally to each other; their K/V
        overwrite cache rows start..start+tokens-1 (so a rejected suffix is rolled back by extending from an
        earlier start). Returns ids [batch] of the last position, or ids [batch, tokens] with every_position (the
        head over each new token); return_hidden and depth as in prefill."""
        for name, value, low in (("start", start, 0), ("tokens", tokens, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name}: must be an int >= {low}, got {value!r}")
        self._check(batch, start + tokens, "start + tokens", None)
        if x is not None and tuple(x.shape) != (batch, tokens, self.config.hidden):
            raise ValueError(f"x: expected shape {[batch, tokens, self.config.hidden]}, got {list(x.shape)}")
        return self._run(self._input(batch, tokens) if x is None else x, start, return_hidden, depth, every_position)

    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.parameters())

    def cache_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers())

    @contextlib.contextmanager
    def record_ops(self) -> Iterator[list[dict]]:
        """Collect, while open, one dict per linear, attention and greedy call as it runs (forward hooks)."""
        ops: list[dict] = []
        handles = []

        def on_linear(name, scope):
            def hook(module, args, out):
                x = args[0]
                ops.append({"op": "linear", "name": name, "scope": scope, "m": x.numel() // x.shape[-1],
                            "n": out.shape[-1], "k": x.shape[-1]})
            return hook

        def on_attention(module, args, out):
            q, k, _, causal = args
            extra = {**({"window_left": module.window_left} if module.window_left >= 0 else {}),
                     **({"sinks": True} if module.sinks is not None else {})}
            ops.append({"op": "attention", "name": "attention", "scope": "layer", "batch": q.shape[0],
                        "q_heads": q.shape[1], "kv_heads": k.shape[1], "q_len": q.shape[2],
                        "kv_len": k.shape[2], "head_dim": q.shape[3], "causal": bool(causal),
                        "page_size": 0, **extra})  # its cache is contiguous

        def on_mla(module, args, out):
            q, latent = args
            ops.append({"op": "mla", "name": "attention", "scope": "layer", "batch": q.shape[0], "q_heads": q.shape[1],
                        "q_len": q.shape[2], "kv_len": latent.shape[2], "head_dim": q.shape[3],
                        "head_dim_v": out.shape[3], "page_size": 0})

        def on_absorb(name):  # the composition's linear of the same FLOPs and weights (bench.spec.steps.mla_attention)
            def hook(module, args, out):
                x, w = args
                ops.append({"op": "linear", "name": name, "scope": "layer", "m": x.shape[1],
                            "n": w.shape[0] * w.shape[2], "k": w.shape[1]})
            return hook

        def on_greedy(module, args, out):
            logits = args[0]
            ops.append({"op": "argmax", "name": "greedy", "scope": "step", "m": logits.numel() // logits.shape[-1],
                        "n": logits.shape[-1]})

        for layer in self.layers:
            block = layer.mla or layer
            for name, module in (*mla_projections(layer), *mlp_projections(layer)):
                handles.append(module.register_forward_hook(on_linear(name, "layer")))
            if layer.mixture is not None:
                handles.append(layer.mixture.experts.register_forward_hook(lambda m, a, o: ops.append(experts_op(a))))
            handles.append(block.attention.register_forward_hook(on_attention))
            if layer.mla is not None:
                handles.append(layer.mla.latent_attention.register_forward_hook(on_mla))
                handles += [getattr(layer.mla, n).register_forward_hook(on_absorb(n)) for n in ("q_absorb", "v_up")]
        handles.append(self.lm_head.register_forward_hook(on_linear("lm_head", "step")))
        handles.append(self.greedy.register_forward_hook(on_greedy))
        try:
            yield ops
        finally:
            for handle in handles:
                handle.remove()


def mla_projections(layer) -> list[tuple[str, nn.Module]]:
    """The linear layers of a decoder layer's attention by name: qkv and o, or MLA's q_kv_a, q_b, kv_b and o."""
    if layer.mla is None:
        return [("qkv", layer.qkv), ("o", layer.o)]
    return [(n, getattr(layer.mla, n)) for n in ("q_kv_a", "q_b", "kv_b", "o") if hasattr(layer.mla, n)]


def _layers_on_meta(config: DecoderConfig, batch: int, tokens: int, layers: int) -> ReferenceDecoder:
    return ReferenceDecoder(config, layers, "meta", torch.float32, max_tokens=tokens, max_batch=batch)


def ops_of_prefill(config: DecoderConfig, batch: int, prompt_len: int, layers: int = 1) -> list[dict]:
    """The ops the first `layers` layers run in a prefill of `batch` prompts of `prompt_len` tokens (scope 'layer'),
    then the per-step lm_head and greedy pick (scope 'step'), traced from a decoder on the meta device."""
    decoder = _layers_on_meta(config, batch, prompt_len, layers)
    with decoder.record_ops() as ops:
        decoder.prefill(batch, prompt_len)
    return ops


def ops_of_decode(config: DecoderConfig, batch: int, context: int, layers: int = 1) -> list[dict]:
    """The ops the first `layers` layers run in a decode step of `batch` sequences after `context` cached tokens,
    then the per-step lm_head and greedy pick, traced as ops_of_prefill is."""
    decoder = _layers_on_meta(config, batch, context + 1, layers)
    with decoder.record_ops() as ops:
        decoder.decode_step(batch, context)
    return ops


def _elem(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def weight_bytes(config: DecoderConfig, layers: int, dtype: torch.dtype) -> int:
    """Bytes of `layers` layers' projections and norms (MLA's latent and q_lora norms too), the final norm, the
    lm_head, and the float32 sinks of a model that has them."""
    norms = (2 * layers + 1) * config.hidden + layers * (config.kv_lora_rank + config.q_lora_rank)
    sinks = 4 * layers * config.q_heads if config.sinks else 0
    return (config.layers_weight_count(layers) + config.vocab * config.hidden + norms) * _elem(dtype) + sinks


def cache_bytes(config: DecoderConfig, layers: int, batch: int, tokens: int, dtype: torch.dtype) -> int:
    """Bytes of the K and V caches [batch, kv_heads, tokens, head_dim] (MLA: the latent cache [batch, tokens,
    latent_dim]) of `layers` layers."""
    if config.attention == "mla":
        return layers * batch * tokens * config.latent_dim * _elem(dtype)
    return 2 * layers * batch * config.kv_heads * tokens * config.head_dim * _elem(dtype)


def activation_bytes(config: DecoderConfig, batch: int, tokens: int, dtype: torch.dtype) -> int:
    """A generous bound on a prefill's live temporaries: a layer's widest intermediates, fp32 scores of a
    materialising attention (SDPA's math path), and the logits."""
    c = config
    rows = batch * tokens
    widest = rows * (3 * c.intermediate + 4 * c.hidden + (c.q_heads + 2 * c.kv_heads) * c.head_dim)
    scores = batch * c.q_heads * tokens * tokens * 4 * 2
    return widest * _elem(dtype) + scores + batch * c.vocab * 4


def time_prefill(decoder: ReferenceDecoder, batch: int, prompt_len: int, timer_cfg: TimerConfig | None = None,
                 range_name: str | None = None) -> Timing:
    """Latency of decoder.prefill(batch, prompt_len) through the kernels' timer (time_call)."""
    return time_call(lambda: decoder.prefill(batch, prompt_len), decoder.device, timer_cfg or TimerConfig(),
                     range_name)


def time_decode_step(decoder: ReferenceDecoder, batch: int, context: int, timer_cfg: TimerConfig | None = None,
                     range_name: str | None = None) -> Timing:
    """Latency of decoder.decode_step(batch, context) through the kernels' timer (time_call)."""
    return time_call(lambda: decoder.decode_step(batch, context), decoder.device, timer_cfg or TimerConfig(),
                     range_name)
