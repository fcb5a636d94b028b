"""What an attention (case, impl) charges in memory (inputs, reference, each impl's scratch) for the fit check."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from ....kernels.attention.triton_attention import uses_split_kv
from ....kernels.attention.triton_decode import MAX_SPLITS, choose_splits
from ...instruments.memory.device_memory import CHECK_COPIES, UNKNOWN_INPUT_COPIES, fit_reason
from .cases import AttentionCase
from .cost import ELEMENT_BYTES, kv_element_bytes, scale_bytes
from .pages import gather_bytes, pool_bytes
from .reference import reference_dtype, reference_scratch_bytes

FLASH_ATTN_MAX_SPLITS = 128  # flash_attn_with_kvcache keeps up to this many fp32 split-KV partials
HOST_MASK_BYTES = 1 + 4  # a host mask per (query, key): the bool, and SDPA's float copy of it


def _elem(case: AttentionCase) -> int:
    return ELEMENT_BYTES[case.dtype]


def _pairs(case: AttentionCase) -> int:
    """Score-matrix elements over all sequences and query heads: B x Hq x Sq x Sk."""
    return case.batch * case.q_heads * case.q_len * case.kv_len


def _rows(case: AttentionCase) -> int:
    """Output rows: B x Hq x Sq."""
    return case.batch * case.q_heads * case.q_len


def _seqlens(case: AttentionCase):
    return getattr(case, "seqlens", None)


def output_bytes(case: AttentionCase) -> int:
    return _rows(case) * case.head_dim * _elem(case)


def input_bytes(case: AttentionCase) -> int:
    """q, k and v as allocated (K/V at the cache length kv_len, or a paged case's pools and block table; an fp8
    cache's codes and scales), plus cache_seqlens for a ragged case."""
    kv = 2 * case.batch * case.kv_heads * case.kv_len * case.head_dim * kv_element_bytes(case)
    if case.paged:
        kv = pool_bytes(case, kv_element_bytes(case))
    lens = 4 * case.batch if _seqlens(case) is not None else 0
    return _rows(case) * case.head_dim * _elem(case) + kv + lens + scale_bytes(case)


def reference_output_bytes(case: AttentionCase, device: torch.device) -> int:
    return _rows(case) * case.head_dim * reference_dtype(case, device).itemsize


def case_bytes(case: AttentionCase, device: torch.device) -> int:
    """What a case holds once for all its impls: the inputs and the reference output, the large-logit check's q and
    reference output (it shares K/V), plus the reference's bounded scratch while it is computed."""
    stress = output_bytes(case) + reference_output_bytes(case, device)
    return input_bytes(case) + reference_output_bytes(case, device) + stress + reference_scratch_bytes(case, device)


def _naive(case: AttentionCase, device: torch.device) -> int:
    # kernels/attention/naive.py, with GQA folded into rows (B x Hkv x G*Sq x Sk = B x Hq x Sq x Sk elements):
    # fp32 copies of q and K (a low-precision case), the fp32 scores and the fp32 softmax together, and the
    # probabilities in the dtype beside them (an fp32 case converts nothing: 8 bytes a pair).
    elem = _elem(case)
    per_pair = 8 + (elem if elem < 4 else 0)
    upcast = 4 * case.head_dim * (_rows(case) + case.batch * case.kv_heads * case.kv_len) if elem < 4 else 0
    mask_rows = case.batch if _seqlens(case) is not None else 1
    mask = 3 * mask_rows * case.q_len * case.kv_len  # the bool keep mask, its inverse, one intermediate
    return _pairs(case) * per_pair + upcast + mask + _gather(case) + _fp8_decode(case)


def _gather(case: AttentionCase) -> int:
    """A paged case on a gather route (naive, SDPA): contiguous K/V copied in the call, and the row index."""
    return gather_bytes(case, kv_element_bytes(case)) if case.paged else 0


def _fp8_decode(case: AttentionCase) -> int:
    """naive's dequantization of an fp8 cache: each of K and V as fp32 codes, their product with the scales, then
    the copy in the dtype (kernels/attention/fp8.py); 0 for a cache in the dtype."""
    if getattr(case, "kv_dtype", "") != "fp8":
        return 0
    return 2 * case.batch * case.kv_heads * case.kv_len * case.head_dim * (8 + _elem(case))


def _sdpa_common(case: AttentionCase, device: torch.device) -> int:
    """SDPA's logsumexp [B, Hq, Sq] fp32, and the host masks kernels/attention/flash.py builds."""
    lse = 4 * _rows(case)
    ragged = _seqlens(case) is not None
    if case.windowed or case.sinks:  # the window's mask ([B or 1, Sq, Sk] at most, bool and additive), the rescale
        lse += HOST_MASK_BYTES * (case.batch if ragged else 1) * case.q_len * case.kv_len + output_bytes(case) * 3
        return lse
    chunk_causal = case.causal and 1 < case.q_len < case.kv_len
    if device.type == "cpu" and (chunk_causal or ragged):
        # the lower-right mask is built on the host ([1, Sq, Sk]; a ragged batch plans one per sequence)
        lse += HOST_MASK_BYTES * case.q_len * case.kv_len * (case.batch if ragged else 1)
    if ragged:  # the per-sequence route: one sequence's output, and its K/V slices should a backend copy them
        lse += output_bytes(case) // case.batch + 2 * case.kv_heads * case.kv_len * case.head_dim * _elem(case)
    return lse


def _flash(case: AttentionCase, device: torch.device) -> int:
    need = _sdpa_common(case, device) + _gather(case)  # flash_attn reads the pages in place: an upper bound there
    if device.type == "cuda" and case.dtype != "float32" and (case.q_len == 1 or _seqlens(case) is not None
                                                              or case.paged):
        # flash_attn's with_kvcache route may split the keys: fp32 partials of the output and the lse
        need = max(need, FLASH_ATTN_MAX_SPLITS * _rows(case) * (case.head_dim + 1) * 4)
    return need


def _sdpa_efficient(case: AttentionCase, device: torch.device) -> int:
    need = _sdpa_common(case, device)
    if _seqlens(case) is not None:  # gathered pages' masked route: a bool [B, 1, Sq, Sk] and its float copy (at most)
        need += HOST_MASK_BYTES * case.batch * case.q_len * case.kv_len
    return need


def split_kv_count(case: AttentionCase) -> int:
    """Splits of the Triton decode kernel: its own choose_splits with no multiprocessor limit, an upper
    bound of what it picks on any device (the SM count is not read, so no CUDA call is made)."""
    unlimited = MAX_SPLITS * case.batch * case.kv_heads
    return choose_splits(case.batch, case.kv_heads, case.kv_len, multiprocessors=unlimited)


def _triton(case: AttentionCase, device: torch.device) -> int:
    shape = SimpleNamespace(q_heads=case.q_heads, kv_heads=case.kv_heads, q_len=case.q_len)
    if not uses_split_kv(shape):
        return 0  # the tiled prefill kernel writes its output and allocates nothing else
    return split_kv_count(case) * _rows(case) * (case.head_dim + 2) * 4  # partial acc, max and sum, fp32


SCRATCH = {"naive": _naive, "flash": _flash, "triton": _triton, "sdpa_efficient": _sdpa_efficient,
           "cudnn": _sdpa_common}


def impl_bytes(case: AttentionCase, impl: str, device: torch.device) -> int:
    """What one impl allocates for a case: its output, its scratch, and the correctness check's temporaries.

    An impl not in SCRATCH (a user's plugin) is charged UNKNOWN_INPUT_COPIES x the inputs as scratch.
    The peaks are summed though they do not all coexist, so this is an upper bound.
    """
    rule = SCRATCH.get(impl)
    scratch = rule(case, device) if rule else UNKNOWN_INPUT_COPIES * input_bytes(case)
    return output_bytes(case) + scratch + CHECK_COPIES * reference_output_bytes(case, device)


def does_not_fit(case: AttentionCase, impl: str, device: torch.device, *, resident: bool = False,
                 free: int | None = None) -> str | None:
    """A one-line reason when the case would not fit in memory here, else None.

    resident: the case's inputs and reference already live on the device (inside the free figure),
    so only the impl is charged. free: the free bytes to check against, else measured here.
    """
    note = "" if impl in SCRATCH else f"; {impl} is charged its output plus {UNKNOWN_INPUT_COPIES}x the inputs"
    return fit_reason(impl, impl_bytes(case, impl, device), case_bytes(case, device), device,
                      resident=resident, free=free, note=note)
