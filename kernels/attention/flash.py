"""FlashAttention: the flash_attn package where installed, else PyTorch SDPA pinned to one backend.

Routes (each reported as the call's backend):
- `flash_attn-<version>` (CUDA, fp16/bf16): `flash_attn_func` for prefill and chunks,
  `flash_attn_with_kvcache` when `cache_seqlens` is given or for decode; both align the causal
  mask bottom-right, like phasebench.
- `sdpa-flash`: `scaled_dot_product_attention` under `sdpa_kernel(FLASH_ATTENTION)`
  (FlashAttention-2 on CUDA, PyTorch's flash kernel on CPU). SDPA's `is_causal` is top-left, so
  a causal chunk with Sq < Sk goes through `causal_lower_right` (suffix `+lower-right`), which
  PyTorch dispatches to the same flash kernel with bottom-right alignment. Ragged
  `cache_seqlens` on a contiguous cache are served by one call per sequence on its own key prefix (suffix
  `+per-seq`, then the suffixes of its sequences' routes): same kernel, B launches, and nothing past a sequence's
  length is read (every pinned backend, a mask-taking one too, and with a window or sinks).
- A paged cache (block_table): `flash_attn_with_kvcache(..., block_table=...)` (suffix `+paged`) where flash_attn
  serves it (pages of a multiple of 256 tokens); without flash_attn, the pages gathered into contiguous K/V inside
  the call and then the SDPA route above, named `gather+sdpa-flash...`.
- `sdpa_efficient` / `cudnn`: the same facade pinned to EFFICIENT_ATTENTION / CUDNN_ATTENTION.
- A sliding window (`window_left`): flash_attn's own `window_size=(window_left, 0)` (`-1` on the right without
  causal); on SDPA a boolean mask over the keys the window can reach (K/V sliced to them, a view; suffix `+window`),
  on routes that take a mask (the host's flash kernel, EFFICIENT_ATTENTION); FLASH_ATTENTION and CUDNN_ATTENTION on
  CUDA take none and raise `Unsupported`.
- Sinks: no FlashAttention-2 kernel has the term. On the host, SDPA's flash kernel returns the rows' log-sum-exp
  (`aten._scaled_dot_product_flash_attention_for_cpu`, the kernel `sdpa-flash` dispatches to), and the output is
  rescaled by sigmoid(lse - sink) = Z / (Z + exp(sink)), all in fp32 and rounded once (suffix `+fp32-lse-sink`: q
  and the keys the window reaches are upcast in the call); on CUDA the SDPA routes raise `Unsupported` (the public
  API returns no log-sum-exp).
- An fp8 KV cache (float8_e4m3fn K/V with scales): every route here raises `Unsupported` (fp8.SDPA_REFUSAL).
A backend that rejects a request at run time raises `Unsupported`; nothing falls back silently.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .. import buffers
from ..errors import Unsupported
from ..registry import Impl, PlannedCall, add_builtin
from .fp8 import SDPA_REFUSAL
from .naive import allowed_keys, window_start
from .paged import gatherer
from .request import AttentionRequest

HALF_DTYPES = frozenset({torch.float16, torch.bfloat16})
FLASH_ATTN_PAGE_MULTIPLE = 256  # flash_attn 2's paged kernels read pages of a multiple of this many tokens
ALL_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32})


def causal_lower_right(q_len: int, kv_len: int):
    """torch's bottom-right causal bias, imported when first used: its module imports torch._dynamo (1.5 s), which
    every worker process of a run would otherwise pay at start-up."""
    from torch.nn.attention.bias import causal_lower_right as bias

    return bias(q_len, kv_len)


@functools.cache
def flash_attn_module():
    """The flash_attn package, or None where it does not import."""
    try:
        import flash_attn
    except Exception:  # ImportError, or a broken CUDA extension
        return None
    return flash_attn


def _sdpa(req: AttentionRequest, backend: SDPBackend, q, k, v, *, is_causal=False, attn_mask=None):
    with sdpa_kernel([backend]):
        try:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                                  scale=req.scale, enable_gqa=req.kv_heads != req.q_heads)
        except RuntimeError as err:
            if "No available kernel" in str(err):
                raise Unsupported(f"{backend.name} rejected this request: {str(err).splitlines()[0]}") from None
            raise


def sdpa_route(req: AttentionRequest, impl: str, backend: SDPBackend, label: str, masks: bool) -> PlannedCall:
    """Plan an SDPA call pinned to one backend; `masks` says whether it takes an explicit attn_mask. A ragged
    contiguous cache runs one call per sequence over its own keys (`+per-seq`): a mask over the whole cache would
    meet what lies past a sequence's length, and a masked key's NaN reaches the output (NaN + -inf, 0 x NaN). A paged
    request's pages are gathered into contiguous K/V inside the call (the label says `gather+`), the keys past a
    length read as the sequence's key 0 (paged.gather_index)."""
    if req.ragged and not req.paged:
        return _each_sequence(req, impl, backend, label, masks)
    q = req.q
    kv = gatherer(req) if req.paged else lambda: (req.k, req.v)
    label = ("gather+" if req.paged else "") + label
    if req.windowed or req.sinks is not None:
        return _masked_with_sinks(req, impl, backend, label, masks or req.device_type == "cpu", kv)
    chunk_causal = req.causal and 1 < req.q_len < req.kv_len
    causal_square = req.causal and req.q_len == req.kv_len  # Sq == 1 needs no mask: it sees every key
    if req.ragged and masks:
        keep = allowed_keys(req)[:, None]  # built here, outside the timed call
        return PlannedCall(impl, label + "+mask", lambda: _sdpa(req, backend, q, *kv(), attn_mask=keep))
    if req.ragged:  # gathered pages, for a backend without masks
        def per_sequence():
            k, v = kv()
            out = buffers.empty_like(q)
            for b, n in enumerate(req.seqlens):
                sq_causal = req.causal and req.q_len > 1
                mask = causal_lower_right(req.q_len, n) if sq_causal and req.q_len < n else None
                out[b:b + 1] = _sdpa(req, backend, q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n],
                                     is_causal=sq_causal and req.q_len == n, attn_mask=mask)
            return out
        return PlannedCall(impl, label + "+per-seq", per_sequence)
    if chunk_causal:
        # On CUDA, causal_lower_right dispatches to the flash kernel with its bottom-right alignment.
        # On the host it would rebuild a boolean mask on every call, so it is built once here.
        bias = allowed_keys(req)[:, None] if req.device_type == "cpu" else causal_lower_right(req.q_len, req.kv_len)
        return PlannedCall(impl, label + "+lower-right", lambda: _sdpa(req, backend, q, *kv(), attn_mask=bias))
    return PlannedCall(impl, label, lambda: _sdpa(req, backend, q, *kv(), is_causal=causal_square))


def _each_sequence(req: AttentionRequest, impl: str, backend: SDPBackend, label: str, masks: bool) -> PlannedCall:
    """A ragged contiguous request as one dense request per sequence over its own keys (views), each planned here
    (its masks built outside the timed call) and run in turn into the batch's output."""
    plans = [sdpa_route(dataclasses.replace(req, q=req.q[b:b + 1], k=req.k[b:b + 1, :, :n], v=req.v[b:b + 1, :, :n],
                                            cache_seqlens=None, seqlens=None), impl, backend, label, masks)
             for b, n in enumerate(req.seqlens)]
    suffixes = "".join(dict.fromkeys(p.backend.removeprefix(label) for p in plans))

    def per_sequence():
        out = buffers.empty_like(req.q)
        for b, plan in enumerate(plans):
            out[b:b + 1] = plan.run()
        return out
    return PlannedCall(impl, f"{label}+per-seq{suffixes}", per_sequence)


def _masked_with_sinks(req: AttentionRequest, impl: str, backend: SDPBackend, label: str, takes_mask: bool,
                       kv) -> PlannedCall:
    """A window as a boolean mask over the keys [first, Sk) some row's window reaches (K/V sliced to them: a view),
    built here, outside the timed call; sinks through the host flash kernel's log-sum-exp."""
    first = window_start(req)
    keep = allowed_keys(req, first)
    if keep is not None and bool(keep.all()):
        keep = None  # a dense decode step's window is the slice itself
    if keep is not None and not takes_mask:
        raise Unsupported(f"{label} on {req.device_type} takes no attention mask, so it cannot honour "
                          f"window_left={req.window_left} on this request")
    label += "+window" if req.windowed else ""
    if req.sinks is None:
        mask = None if keep is None else keep[:, None]
        return PlannedCall(impl, label, lambda: _sdpa(req, backend, req.q, *(t[:, :, first:] for t in kv()),
                                                     attn_mask=mask))
    if req.device_type != "cpu" or backend != SDPBackend.FLASH_ATTENTION:
        raise Unsupported(f"{label} returns no log-sum-exp on {req.device_type}, so it cannot add a sink term "
                          "(naive and triton serve sinks)")
    additive = None if keep is None else torch.zeros(keep[:, None].shape, device=req.q.device).masked_fill_(
        ~keep[:, None], float("-inf"))
    sinks = req.sinks[None, :, None]

    def with_sinks():
        # in fp32 (q and the keys the window reaches upcast in the call): rescaling an output already rounded to
        # bf16 would round it twice, about 2x the error of one rounding, past the gate's limit
        k, v = (t[:, :, first:].float() for t in kv())
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            req.q.float(), k, v, 0.0, False, attn_mask=additive, scale=req.scale)
        # Z / (Z + exp(sink)) with Z = exp(lse): the sink's share leaves the denominator
        return out.mul_(torch.sigmoid(lse - sinks)[..., None]).to(req.dtype)
    return PlannedCall(impl, label + "+fp32-lse-sink", with_sinks)


def _flash_attn_paged(req: AttentionRequest, fa, label: str) -> PlannedCall:
    """flash_attn_with_kvcache on the pools themselves ([num_pages, page_size, Hkv, D] is its layout)."""
    if req.page_size % FLASH_ATTN_PAGE_MULTIPLE:
        raise Unsupported(f"{label} reads pages of a multiple of {FLASH_ATTN_PAGE_MULTIPLE} tokens only, "
                          f"got page_size {req.page_size}")
    q = req.q.transpose(1, 2)
    lens = req.cache_seqlens if req.cache_seqlens is not None else torch.full(
        (req.batch,), req.kv_len, dtype=torch.int32, device=q.device)

    def paged():
        out = fa.flash_attn_with_kvcache(q, req.k, req.v, cache_seqlens=lens, block_table=req.block_table,
                                         softmax_scale=req.scale, causal=req.causal, window_size=_window_size(req))
        return out.transpose(1, 2)
    return PlannedCall("flash", label + ":with_kvcache+paged", paged)


def _window_size(req: AttentionRequest) -> tuple[int, int]:
    """flash_attn's (left, right) window: its keys [i + Sk - Sq - left, i + Sk - Sq + right] are FlashInfer's
    window_left on the left, and the causal diagonal (0) or no bound (-1) on the right."""
    if not req.windowed:
        return (-1, -1)
    return (req.window_left, 0 if req.causal else -1)


def _flash_attn_route(req: AttentionRequest, fa) -> PlannedCall:
    label = f"flash_attn-{getattr(fa, '__version__', '?')}"
    if req.sinks is not None:
        raise Unsupported(f"{label} has no attention-sink term (FlashAttention-2); naive and triton serve sinks")
    if req.paged:
        return _flash_attn_paged(req, fa, label)
    # flash_attn wants BSHD; a transposed view of BHSD keeps stride(-1) == 1, so no copy is made
    q, k, v = (t.transpose(1, 2) for t in (req.q, req.k, req.v))
    if req.cache_seqlens is not None or req.q_len == 1:
        def kvcache():
            out = fa.flash_attn_with_kvcache(q, k, v, cache_seqlens=req.cache_seqlens,
                                             softmax_scale=req.scale, causal=req.causal,
                                             window_size=_window_size(req))
            return out.transpose(1, 2)
        return PlannedCall("flash", label + ":with_kvcache", kvcache)

    def func():
        return fa.flash_attn_func(q, k, v, softmax_scale=req.scale, causal=req.causal,
                                  window_size=_window_size(req)).transpose(1, 2)
    return PlannedCall("flash", label + ":func", func)


def _plan_flash(req: AttentionRequest) -> PlannedCall:
    fa = flash_attn_module()
    if fa is not None and req.device_type == "cuda" and req.dtype in HALF_DTYPES:
        return _flash_attn_route(req, fa)
    if req.device_type == "cuda" and req.dtype not in HALF_DTYPES:
        raise Unsupported(f"FlashAttention on CUDA needs float16/bfloat16, got {req.dtype}")
    return sdpa_route(req, "flash", SDPBackend.FLASH_ATTENTION, "sdpa-flash", masks=False)


def _flash_backends(device_type: str) -> str:
    if device_type == "cuda" and flash_attn_module() is not None:
        return f"flash_attn-{flash_attn_module().__version__} (fp16/bf16), sdpa-flash otherwise"
    return "sdpa-flash"


def _plan_pinned(name: str, backend: SDPBackend, masks: bool):
    def plan(req: AttentionRequest) -> PlannedCall:
        if not masks and req.causal and 1 < req.q_len < req.kv_len:
            raise Unsupported(f"{name} has no bottom-right causal mask for q_len < kv_len")
        return sdpa_route(req, name, backend, f"sdpa-{name}", masks=masks)
    return plan


def _cuda_only(device_type: str) -> str | None:
    return None if torch.cuda.is_available() else "no CUDA device here"


FLASH = add_builtin(Impl(
    name="flash",
    summary="FlashAttention: flash_attn package if installed, else SDPA pinned to FLASH_ATTENTION",
    devices=frozenset({"cpu", "cuda"}),
    dtypes=ALL_DTYPES,
    plan=_plan_flash,
    paged=True,
    window=True,
    sinks=True,  # on the host's SDPA route only (its log-sum-exp); the others raise Unsupported when planned
    backends=_flash_backends,
    fp8_refusal=SDPA_REFUSAL,
))

SDPA_EFFICIENT = add_builtin(Impl(
    name="sdpa_efficient",
    summary="PyTorch SDPA pinned to EFFICIENT_ATTENTION (memory-efficient / xFormers kernel)",
    devices=frozenset({"cuda"}),
    dtypes=ALL_DTYPES,
    plan=_plan_pinned("efficient", SDPBackend.EFFICIENT_ATTENTION, masks=True),
    window=True,
    unavailable=_cuda_only,
    backends=lambda device_type: "sdpa-efficient",
    fp8_refusal=SDPA_REFUSAL,
))

CUDNN = add_builtin(Impl(
    name="cudnn",
    summary="PyTorch SDPA pinned to CUDNN_ATTENTION",
    devices=frozenset({"cuda"}),
    dtypes=HALF_DTYPES,
    plan=_plan_pinned("cudnn", SDPBackend.CUDNN_ATTENTION, masks=False),
    ragged=False,
    max_head_dim=128,
    unavailable=_cuda_only,
    backends=lambda device_type: "sdpa-cudnn",
    fp8_refusal=SDPA_REFUSAL,
))
