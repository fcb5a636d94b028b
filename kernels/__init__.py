"""Operator implementations behind one calling convention each: attention (BHSD, GQA, bottom-right causal), linear."""

from __future__ import annotations

# isort: off
from . import triton_mode  # noqa: F401  (first: sets TRITON_INTERPRET before any kernel is defined)
from . import flash, linear_naive, linear_torch, naive  # noqa: F401  (registers the implementations)
# isort: on
from .elementwise import elementwise, prepare_elementwise
from .errors import Unsupported
from .linear_request import LinearRequest, validate_linear
from .plugins import load_plugin, register
from .registry import IMPLS, OPS, AttentionCall, Impl, available_impls, describe_impls, get_impl
from .request import AttentionRequest, validate

try:
    from . import triton_attention, triton_linear  # noqa: F401
except ImportError as err:  # no triton on this platform: the other implementations still work
    TRITON_IMPORT_ERROR = str(err)
else:
    TRITON_IMPORT_ERROR = None

__all__ = ["attention", "prepare", "backend_for", "available_impls", "describe_impls", "Unsupported",
           "AttentionCall", "AttentionRequest", "Impl", "IMPLS", "get_impl", "validate",
           "register", "load_plugin", "linear", "prepare_linear", "LinearRequest", "validate_linear", "OPS",
           "elementwise", "prepare_elementwise"]


def prepare(q, k, v, *, impl, causal=False, scale=None, cache_seqlens=None) -> AttentionCall:
    """Validate and plan a call without running it: `.backend` names what serves it, `.run()` runs it."""
    chosen = get_impl(impl)
    req = validate(q, k, v, causal=causal, scale=scale, cache_seqlens=cache_seqlens)
    chosen.check(req)
    return chosen.plan(req)


def attention(q, k, v, *, impl, causal=False, scale=None, cache_seqlens=None):
    """Attention of q [B, Hq, Sq, D] over k, v [B, Hkv, Sk, D]; returns [B, Hq, Sq, D] in q's dtype."""
    return prepare(q, k, v, impl=impl, causal=causal, scale=scale, cache_seqlens=cache_seqlens).run()


def backend_for(q, k, v, *, impl, causal=False, scale=None, cache_seqlens=None) -> str:
    """The concrete backend that `attention` with the same arguments uses."""
    return prepare(q, k, v, impl=impl, causal=causal, scale=scale, cache_seqlens=cache_seqlens).backend


def prepare_linear(x, w, *, impl) -> AttentionCall:
    """Validate and plan `linear` without running it: `.backend` names what serves it, `.run()` runs it."""
    chosen = get_impl(impl, op="linear")
    req = validate_linear(x, w)
    chosen.check(req)
    return chosen.plan(req)


def linear(x, w, *, impl):
    """x [M, K] times w [N, K] transposed (the nn.Linear layout): [M, N] in x's dtype, fp32 accumulation."""
    return prepare_linear(x, w, impl=impl).run()
