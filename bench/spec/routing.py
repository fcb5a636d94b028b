"""How the tokens of a mixture-of-experts case are routed, drawn from a seed without torch, so that the cost model,
the inputs and the analysis see the same experts: uniform, skewed (a Zipf law over the experts, exponent in the name:
zipf-1.2) or balanced (every expert the same number of slots, give or take one); and the expected number of experts
a batch touches under uniform routing, E * (1 - (1 - k/E) ** B).

Token t's draw uses only the generator's values for rows 0..t, so a larger batch routes its first tokens as a
smaller one does: the experts touched grow with the batch as they do on a server.
"""

from __future__ import annotations

import functools
import re

import numpy as np

ROUTINGS = ("uniform", "balanced", "zipf-S")  # zipf-S: S a positive exponent, e.g. zipf-1.2


def zipf_exponent(routing) -> float | None:
    """The exponent of a `zipf-S` routing, None for the others; a one-line ValueError for a name of none of them."""
    if routing in ("uniform", "balanced"):
        return None
    found = re.fullmatch(r"zipf-(\d+(?:\.\d+)?)", routing) if isinstance(routing, str) else None
    if found is None or float(found.group(1)) <= 0:
        raise ValueError(f"routing: must be uniform, balanced or zipf-S with S a positive exponent (zipf-1.2), "
                         f"got {routing!r}")
    return float(found.group(1))


def check_routing(m: int, experts: int, top_k: int, routing: str) -> None:
    for name, value in (("m", m), ("experts", experts), ("top_k", top_k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: must be a positive int, got {value!r}")
    if top_k > experts:
        raise ValueError(f"top_k: must be at most the {experts} experts, got {top_k}")
    zipf_exponent(routing)


@functools.lru_cache(maxsize=256)
def _draw(m: int, experts: int, top_k: int, routing: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    labels = rng.permutation(experts)  # which expert is the popular one, balanced's order
    if routing == "balanced":  # slot s = t * k + j goes to expert s mod E: k consecutive slots are k experts
        ids = labels[np.arange(m * top_k).reshape(m, top_k) % experts]
    else:
        exponent = zipf_exponent(routing)
        weights = np.zeros(experts) if exponent is None else -exponent * np.log(np.arange(1, experts + 1))
        # Gumbel top-k: k experts without replacement, each with probability ~ its weight (uniform: all equal)
        keys = weights[np.argsort(labels)] - np.log(-np.log(rng.random((m, experts))))
        ids = np.argsort(-keys, axis=1, kind="stable")[:, :top_k]
    ids = np.ascontiguousarray(ids, dtype=np.int32)
    ids.flags.writeable = False
    return ids


def draw_routing(m: int, experts: int, top_k: int, routing: str, seed: int = 0) -> np.ndarray:
    """The experts of each token: int32 [m, top_k], distinct within a row, the same for the same arguments."""
    check_routing(m, experts, top_k, routing)
    return _draw(m, experts, top_k, routing, int(seed))


def touched_experts(m: int, experts: int, top_k: int, routing: str, seed: int = 0) -> int:
    """How many distinct experts the drawn routing sends at least one token to."""
    return int(np.unique(draw_routing(m, experts, top_k, routing, seed)).size)


def expected_touched(experts: int, top_k: int, tokens) -> np.ndarray | float:
    """The expected distinct experts of `tokens` tokens under uniform routing: E * (1 - (1 - k/E) ** B)."""
    return experts * (1.0 - (1.0 - top_k / experts) ** np.asarray(tokens, dtype=float))
