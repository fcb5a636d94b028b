"""Cost model: FLOPs of the two matmuls over the kept (query, key) pairs, minimum bytes read and written, intensity."""

from __future__ import annotations

from .cases import AttentionCase
from .pages import table_read_bytes

ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def sequence_pairs(q_len: int, kv_len: int, causal: bool) -> float:
    """(query, key) pairs one sequence keeps: Sq*Sk, or with the bottom-right causal mask Sq*(Sk-Sq) + Sq*(Sq+1)/2."""
    if not causal:
        return float(q_len * kv_len)
    return q_len * (kv_len - q_len) + q_len * (q_len + 1) / 2


def pairs(case: AttentionCase) -> float:
    """Kept (query, key) pairs of one sequence; for a ragged batch, the mean over its sequences."""
    if case.seqlens is None:
        return sequence_pairs(case.q_len, case.kv_len, case.causal)
    return sum(sequence_pairs(case.q_len, n, case.causal) for n in case.seqlens) / case.batch


def flops(case: AttentionCase) -> float:
    """4 * B * Hq * D * pairs: QK^T and PV, two FLOPs per multiply-add, each sequence with its own length."""
    return 4.0 * case.batch * case.q_heads * case.head_dim * pairs(case)


def moved_bytes(case: AttentionCase) -> tuple[float, float]:
    """(bytes read, bytes written): q, k and v read once and o written once; K/V counted by kv heads (GQA) and by the
    keys each sequence uses.

    A paged cache adds its block-table reads (4 bytes per page a sequence holds). Its K/V are counted by the keys
    read, as for a contiguous cache: the tail of a sequence's last page is never read (every kernel masks it), so
    the same case at every page size moves the same K/V bytes and their GB/s compare directly."""
    elem, d = ELEMENT_BYTES[case.dtype], case.head_dim
    queries = case.batch * case.q_heads * case.q_len * d  # q in, o out: the same shape
    kv = 2 * case.kv_heads * sum(case.lengths) * d
    return float(elem * (queries + kv) + table_read_bytes(case)), float(elem * queries)


def min_bytes(case: AttentionCase) -> float:
    """Read q, k, v once and write o once (moved_bytes, summed)."""
    return sum(moved_bytes(case))


def intensity(case: AttentionCase) -> float:
    """FLOPs per byte of the minimum traffic."""
    return flops(case) / min_bytes(case)
