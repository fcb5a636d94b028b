"""Cost model: FLOPs of the two matmuls over the kept (query, key) pairs, minimum bytes, intensity."""

from __future__ import annotations

from .cases import AttentionCase

ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def pairs(case: AttentionCase) -> float:
    """(query, key) pairs the mask keeps: Sq*Sk, or with the bottom-right causal mask Sq*(Sk-Sq) + Sq*(Sq+1)/2."""
    sq, sk = case.q_len, case.kv_len
    if not case.causal:
        return float(sq * sk)
    return sq * (sk - sq) + sq * (sq + 1) / 2


def flops(case: AttentionCase) -> float:
    """4 * B * Hq * D * pairs: QK^T and PV, two FLOPs per multiply-add."""
    return 4.0 * case.batch * case.q_heads * case.head_dim * pairs(case)


def min_bytes(case: AttentionCase) -> float:
    """Read q, k, v once and write o once; K/V counted by kv heads (GQA)."""
    elem = ELEMENT_BYTES[case.dtype]
    d = case.head_dim
    return float(elem * 2 * case.batch * d * (case.q_heads * case.q_len + case.kv_heads * case.kv_len))


def intensity(case: AttentionCase) -> float:
    """FLOPs per byte of the minimum traffic."""
    return flops(case) / min_bytes(case)
