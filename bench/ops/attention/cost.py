"""Cost model: FLOPs of the two matmuls over the kept (query, key) pairs, minimum bytes read and written, intensity."""

from __future__ import annotations

from .cases import AttentionCase
from .pages import table_read_bytes

ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
SINK_BYTES = 4  # one float32 sink logit per query head
FP8_BYTES = 1  # an e4m3 code
SCALE_BYTES = 4  # a float32 scale of an fp8 cache


def kv_element_bytes(case) -> int:
    """Bytes of one stored K/V (or latent) element: one for an fp8 cache, else the case's dtype's."""
    return FP8_BYTES if getattr(case, "kv_dtype", "") == "fp8" else ELEMENT_BYTES[case.dtype]


def scale_bytes(case) -> int:
    """The float32 scales an fp8 cache's call reads: K's and V's, one per KV head (the bench's inputs); 0 else."""
    return 2 * SCALE_BYTES * case.kv_heads if getattr(case, "kv_dtype", "") == "fp8" else 0


def _sum_min(low: int, high: int, cap: int) -> int:
    """sum of min(p, cap) for p in [low, high] (empty when high < low)."""
    if high < low:
        return 0
    if cap >= high:
        return (low + high) * (high - low + 1) // 2
    if cap < low:
        return cap * (high - low + 1)
    return (low + cap) * (cap - low + 1) // 2 + cap * (high - cap)


def sequence_pairs(q_len: int, kv_len: int, causal: bool, window_left: int = -1) -> float:
    """(query, key) pairs one sequence keeps: Sq*Sk, or with the bottom-right causal mask Sq*(Sk-Sq) + Sq*(Sq+1)/2;
    a window keeps of the query at position p (p = Sk - Sq .. Sk - 1) only keys j >= p - window_left."""
    if window_left < 0:
        if not causal:
            return float(q_len * kv_len)
        return q_len * (kv_len - q_len) + q_len * (q_len + 1) / 2
    first, last = kv_len - q_len, kv_len - 1  # the queries' positions (some negative when Sq > Sk, not causal)
    # keys cut on the left: max(0, p - window_left) = p - min(p, window_left) for p >= 0; none for p < 0
    lo = max(first, 0)
    cut = (lo + last) * (last - lo + 1) // 2 - _sum_min(lo, last, window_left) if last >= lo else 0
    if causal:  # key p itself and the min(p, window_left) before it
        return float(q_len + _sum_min(first, last, window_left))
    return float(q_len * kv_len - cut)


def pairs(case: AttentionCase) -> float:
    """Kept (query, key) pairs of one sequence; for a ragged batch, the mean over its sequences."""
    return sum(sequence_pairs(case.q_len, n, case.causal, case.window_left) for n in case.lengths) / case.batch


def flops(case: AttentionCase) -> float:
    """4 * B * Hq * D * pairs: QK^T and PV, two FLOPs per multiply-add, each sequence with its own length."""
    return 4.0 * case.batch * case.q_heads * case.head_dim * pairs(case)


def kv_read_bytes(case: AttentionCase) -> float:
    """The K and V bytes a call reads: the keys some query's window reaches (case.keys_read) of each sequence's length,
    by kv heads; an fp8 cache one byte an element, and its scales."""
    return float(kv_element_bytes(case) * 2 * case.kv_heads * sum(case.keys_read(n) for n in case.lengths)
                 * case.head_dim + scale_bytes(case))


def moved_bytes(case: AttentionCase) -> tuple[float, float]:
    """(bytes read, bytes written): q, k and v read once and o written once; K/V counted by kv heads (GQA) and by the
    keys each sequence uses.

    A paged cache adds its block-table reads (4 bytes per page a sequence holds). Its K/V are counted by the keys
    read, as for a contiguous cache: the tail of a sequence's last page is never read (every kernel masks it), so
    the same case at every page size moves the same K/V bytes and their GB/s compare directly.

    A sliding window reads only the keys some query's window reaches (case.keys_read), and sinks add their float32
    logit per query head. An fp8 cache (kv_dtype "fp8") reads one byte per K/V element plus its float32 scales; q and
    o keep the case's dtype."""
    elem, d = ELEMENT_BYTES[case.dtype], case.head_dim
    queries = case.batch * case.q_heads * case.q_len * d  # q in, o out: the same shape
    sinks = SINK_BYTES * case.q_heads if case.sinks else 0
    return float(elem * queries + kv_read_bytes(case) + table_read_bytes(case) + sinks), float(elem * queries)


def min_bytes(case: AttentionCase) -> float:
    """Read q, k, v once and write o once (moved_bytes, summed)."""
    return sum(moved_bytes(case))


def intensity(case: AttentionCase) -> float:
    """FLOPs per byte of the minimum traffic."""
    return flops(case) / min_bytes(case)
