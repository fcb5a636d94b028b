"""phasebench.kernels: operator implementations behind one calling convention each, and the one registry.

One package per operator (attention/, linear/, elementwise/, qlinear/, mla/, moe/: its request validation and
implementations);
beside them the shared helpers: registry (operators and their implementations), plugins (users' kernels),
errors, buffers, triton_mode (interpreter or compiled, decided before any kernel is defined) and autotune
(the autotuner's winners). The facade below is the public API. Imports nothing else of phasebench.
"""

from __future__ import annotations

# isort: off
from . import triton_mode  # noqa: F401  (first: sets TRITON_INTERPRET before any kernel is defined)
from .attention import TRITON_IMPORT_ERROR
from . import linear as _linear, elementwise as _elementwise, qlinear as _qlinear, mla as _mla  # noqa: F401
from . import moe as _moe  # noqa: F401  (declare, register)
# isort: on
from .attention.request import AttentionRequest, validate
from .elementwise.request import validate_elementwise
from .errors import Unsupported
from .linear.request import LinearRequest, validate_linear
from .mla.request import MLARequest, validate_mla
from .moe.request import MoeRequest, route, validate_moe
from .plugins import load_plugin, register
from .qlinear.request import QLinearRequest, validate_qlinear
from .qlinear.schemes import SCHEMES, QuantizedWeight, quantize
from .registry import OPS, Impl, PlannedCall, add_operator, available_impls, describe_impls, get_impl

IMPLS = OPS["attention"]  # the attention implementations by name
AttentionCall = PlannedCall  # its old name, kept in the facade's API (__all__): it was never attention's alone

__all__ = ["attention", "prepare", "backend_for", "available_impls", "describe_impls", "Unsupported",
           "PlannedCall", "AttentionCall", "AttentionRequest", "Impl", "IMPLS", "get_impl", "validate",
           "register", "load_plugin", "linear", "prepare_linear", "LinearRequest", "validate_linear", "OPS",
           "elementwise", "prepare_elementwise", "add_operator", "TRITON_IMPORT_ERROR", "qlinear", "prepare_qlinear",
           "quantize", "QuantizedWeight", "QLinearRequest", "validate_qlinear", "SCHEMES", "mla_decode", "prepare_mla",
           "MLARequest", "validate_mla", "moe", "prepare_moe", "route", "MoeRequest", "validate_moe"]

# The facade functions below share their names with the operator packages: they are defined after the
# packages are imported, so `phasebench.kernels.attention` is the function (import the packages' modules
# with `from phasebench.kernels.attention import triton_attention`).


def prepare(q, k, v, *, impl, causal=False, scale=None, cache_seqlens=None, block_table=None, window_left=-1,
            sinks=None, k_scale=None, v_scale=None) -> PlannedCall:
    """Validate and plan a call without running it: `.backend` names what serves it, `.run()` runs it."""
    chosen = get_impl(impl)
    req = validate(q, k, v, causal=causal, scale=scale, cache_seqlens=cache_seqlens, block_table=block_table,
                   window_left=window_left, sinks=sinks, k_scale=k_scale, v_scale=v_scale)
    chosen.check(req)
    return chosen.plan(req)


def attention(q, k, v, *, impl, causal=False, scale=None, cache_seqlens=None, block_table=None, window_left=-1,
              sinks=None, k_scale=None, v_scale=None):
    """Attention of q [B, Hq, Sq, D] over k, v [B, Hkv, Sk, D]; returns [B, Hq, Sq, D] in q's dtype. With
    `block_table` (int32 [B, max_pages]), k and v are pools of pages [num_pages, page_size, Hkv, D].
    `window_left` (FlashInfer's): the query at position i (bottom-right aligned) sees keys j >= i - window_left
    (-1: no window); `sinks` (float32 [Hq]): a logit per head added to the softmax denominator (gpt-oss).
    An fp8 KV cache: k and v float8_e4m3fn codes, `k_scale` / `v_scale` float32 of shape [] or [Hkv] (value = code x
    scale)."""
    return prepare(q, k, v, impl=impl, causal=causal, scale=scale, cache_seqlens=cache_seqlens,
                   block_table=block_table, window_left=window_left, sinks=sinks, k_scale=k_scale,
                   v_scale=v_scale).run()


def backend_for(q, k, v, *, impl, causal=False, scale=None, cache_seqlens=None, block_table=None, window_left=-1,
                sinks=None, k_scale=None, v_scale=None) -> str:
    """The concrete backend that `attention` with the same arguments uses."""
    return prepare(q, k, v, impl=impl, causal=causal, scale=scale, cache_seqlens=cache_seqlens,
                   block_table=block_table, window_left=window_left, sinks=sinks, k_scale=k_scale,
                   v_scale=v_scale).backend


def prepare_linear(x, w, *, impl) -> PlannedCall:
    """Validate and plan `linear` without running it: `.backend` names what serves it, `.run()` runs it."""
    chosen = get_impl(impl, op="linear")
    req = validate_linear(x, w)
    chosen.check(req)
    return chosen.plan(req)


def linear(x, w, *, impl):
    """x [M, K] times w [N, K] transposed (the nn.Linear layout): [M, N] in x's dtype, fp32 accumulation."""
    return prepare_linear(x, w, impl=impl).run()


def prepare_elementwise(kind, *tensors, impl="torch", **options) -> PlannedCall:
    """Validate and plan `elementwise` without running it: `.backend` names what serves it, `.run()` runs it."""
    chosen = get_impl(impl, op="elementwise")
    req = validate_elementwise(kind, *tensors, **options)
    chosen.check(req)
    return chosen.plan(req)


def elementwise(kind, *tensors, impl="torch", **options):
    """One elementwise kind of a decoder layer (see KINDS and SIGNATURES); output in the first tensor's dtype:
    rmsnorm(x, weight, eps=1e-6), residual_add(x, residual), silu_mul(gate_up), rotary(q, k, positions,
    base=500000.0) -> (q, k), kv_append(cache_k, cache_v, k, v, positions) -> the caches written in place,
    greedy_pick(logits) -> int64 [M], add_rmsnorm(x, residual, weight, eps=1e-6) -> (rmsnorm(x + residual), x +
    residual)."""
    return prepare_elementwise(kind, *tensors, impl=impl, **options).run()


def prepare_qlinear(x, qweight, *, impl) -> PlannedCall:
    """Validate and plan `qlinear` without running it: `.backend` names what serves it, `.run()` runs it."""
    chosen = get_impl(impl, op="qlinear")
    req = validate_qlinear(x, qweight)
    chosen.check(req)
    return chosen.plan(req)


def qlinear(x, qweight, *, impl):
    """x [M, K] times a weight packed by `quantize(w, scheme)` (w [N, K], nn.Linear layout): [M, N] in x's dtype,
    fp32 accumulation; the weights are those `qweight.dequantize()` returns."""
    return prepare_qlinear(x, qweight, impl=impl).run()


def prepare_mla(q, latent, *, impl, scale, v_dim=512, cache_seqlens=None, block_table=None,
                latent_scale=None) -> PlannedCall:
    """Validate and plan `mla_decode` without running it: `.backend` names what serves it, `.run()` runs it."""
    chosen = get_impl(impl, op="mla")
    req = validate_mla(q, latent, scale=scale, v_dim=v_dim, cache_seqlens=cache_seqlens, block_table=block_table,
                       latent_scale=latent_scale)
    chosen.check(req)
    return chosen.plan(req)


def mla_decode(q, latent, *, impl, scale, v_dim=512, cache_seqlens=None, block_table=None, latent_scale=None):
    """MLA decode with the projections absorbed: q [B, Hq, Sq, D] (Sq 1 or 2, bottom-right causal) against one
    latent per token, [B, 1, Sk, D] or pools of pages [num_pages, page_size, 1, D] with `block_table`; the value is the
    latent's first `v_dim` dims (DeepSeek: D 576 = 512 + 64 rotary, v_dim 512); returns [B, Hq, Sq, v_dim] in q's
    dtype. `scale` is required: MLA's is 1/sqrt(qk_nope + qk_rope dims), not 1/sqrt(D). An fp8 latent cache:
    float8_e4m3fn codes and `latent_scale`, one float32 scale (shape []) for the tensor."""
    return prepare_mla(q, latent, impl=impl, scale=scale, v_dim=v_dim, cache_seqlens=cache_seqlens,
                       block_table=block_table, latent_scale=latent_scale).run()


def prepare_moe(x, w_gate_up, w_down, topk_weights, topk_ids, *, impl) -> PlannedCall:
    """Validate and plan `moe` without running it: `.backend` names what serves it, `.run()` runs it."""
    chosen = get_impl(impl, op="moe")
    req = validate_moe(x, w_gate_up, w_down, topk_weights, topk_ids)
    chosen.check(req)
    return chosen.plan(req)


def moe(x, w_gate_up, w_down, topk_weights, topk_ids, *, impl):
    """Routed experts: x [M, K] through each token's experts topk_ids [M, k] (int32) weighted by topk_weights
    (float32), w_gate_up [E, 2N, K] (gate rows first), w_down [E, K, N]: [M, K] in x's dtype, the sum over a token's
    experts of weight x w_down[e] (SiLU(gate) * up), fp32 accumulation (`route` makes ids and weights)."""
    return prepare_moe(x, w_gate_up, w_down, topk_weights, topk_ids, impl=impl).run()
