"""Elementwise cases (norms, adds, activations, RoPE, KV append, greedy pick) and their cost model."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields

from ...spec.models import model_config
from ..linear.cases import ELEMENT_BYTES

# kernels.elementwise.KINDS, repeated here so that cases and their cost need no torch
KINDS = ("rmsnorm", "residual_add", "silu_mul", "rotary", "kv_append", "greedy_pick", "add_rmsnorm")
ELEMENTWISE_PHASES = ("prefill", "chunked_prefill", "decode")
# What n counts for each kind (the input of silu_mul is 2n wide; rotary's q has n heads, kv_append's k n heads).
N_MEANS = {"rmsnorm": "hidden", "residual_add": "hidden", "silu_mul": "intermediate", "rotary": "q_heads",
           "kv_append": "kv_heads", "greedy_pick": "vocab", "add_rmsnorm": "hidden"}
# The optional fields each kind takes; the others must stay 0.
KIND_FIELDS = {"rotary": ("head_dim", "kv_heads", "cache_len"), "kv_append": ("head_dim", "cache_len")}
OPTIONAL_FIELDS = ("head_dim", "kv_heads", "cache_len")
POSITION_BYTES = 8  # positions are int64
INDEX_BYTES = 8  # greedy_pick writes int64 token ids


@dataclass(frozen=True)
class ElementwiseCase:
    """One memory-bound op of a decoder layer over m tokens; n is the width the kind names (N_MEANS).

    rotary: q [m, n, head_dim] and k [m, kv_heads, head_dim] at positions ending at cache_len - 1 (0..m-1 when
    cache_len is 0); kv_append: k, v [m, n, head_dim] written into caches of cache_len rows at the last m."""

    kind: str
    m: int
    n: int
    dtype: str
    phase: str
    model: str = ""
    head_dim: int = 0
    kv_heads: int = 0
    cache_len: int = 0

    op = "elementwise"

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind: must be one of {', '.join(KINDS)}, got {self.kind!r}")
        for name in ("m", "n", *OPTIONAL_FIELDS):
            value, least = getattr(self, name), 1 if name in ("m", "n") else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name}: must be a {'positive' if least else 'non-negative'} int, got {value!r}")
        if self.dtype not in ELEMENT_BYTES:
            raise ValueError(f"dtype: must be one of {', '.join(ELEMENT_BYTES)}, got {self.dtype!r}")
        if self.phase not in ELEMENTWISE_PHASES:
            raise ValueError(f"phase: must be one of {', '.join(ELEMENTWISE_PHASES)}, got {self.phase!r}")
        takes = KIND_FIELDS.get(self.kind, ())
        for name in OPTIONAL_FIELDS:
            if name not in takes and getattr(self, name):
                raise ValueError(f"{name}: {self.kind} does not take it (must be 0), got {getattr(self, name)}")
        if self.kind in KIND_FIELDS:
            needed = ("head_dim", "kv_heads") if self.kind == "rotary" else ("head_dim", "cache_len")
            for name in needed:
                if not getattr(self, name):
                    raise ValueError(f"{name}: {self.kind} needs a positive {name}, got 0")
        if self.kind == "rotary" and self.head_dim % 2:
            raise ValueError(f"head_dim: rotary needs an even head dim (rotate-half), got {self.head_dim}")
        if self.kind in KIND_FIELDS and self.cache_len and self.cache_len < self.m:
            raise ValueError(f"cache_len: must be at least m = {self.m} (the positions end at cache_len - 1), "
                             f"got {self.cache_len}")

    @property
    def shape_label(self) -> str:
        """Short shape text for tables: 'rmsnorm m128 n4096', 'rotary m8 n32 hkv8 d128 c4096'."""
        extra = [f"{tag}{getattr(self, name)}" for tag, name in (("hkv", "kv_heads"), ("d", "head_dim"),
                                                                  ("c", "cache_len")) if getattr(self, name)]
        return " ".join([self.kind, f"m{self.m}", f"n{self.n}", *extra])

    @property
    def positions_start(self) -> int:
        """The first position rotary and kv_append use: the last m positions of cache_len."""
        return max(self.cache_len - self.m, 0)

    def fields(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def row_fields(self) -> dict:
        """The case's columns in a result row; fields the kind does not take are left out (empty columns)."""
        takes = KIND_FIELDS.get(self.kind, ())
        kept = {k: v for k, v in self.fields().items() if k not in OPTIONAL_FIELDS or k in takes}
        return {**kept, "op": self.op}


# The model dimension each kind's n takes in a sweep (the kinds a model's dims alone define)
SWEEP_WIDTH = {"rmsnorm": "hidden", "residual_add": "hidden", "silu_mul": "intermediate", "add_rmsnorm": "hidden"}


@dataclass(frozen=True)
class ElementwiseSweep:
    """Each kind at each M of the given models, standing for one phase, n the model's width for the kind."""

    models: tuple[str, ...]
    m: tuple[int, ...]
    phase: str
    kinds: tuple[str, ...] = tuple(SWEEP_WIDTH)

    def cases(self, dtype: str, models: tuple[str, ...] | None = None) -> list[ElementwiseCase]:
        out = []
        for model, kind, m in itertools.product(models or self.models, self.kinds, self.m):
            config = model_config(model)
            out.append(ElementwiseCase(kind, m, getattr(config, SWEEP_WIDTH[kind]), dtype, self.phase, model))
        return out


def tensor_elements(case: ElementwiseCase) -> tuple[int, int]:
    """(elements read, elements written) of floating tensors, each once: the data any kernel must move."""
    m, n, d = case.m, case.n, case.head_dim
    if case.kind == "rmsnorm":
        return m * n + n, m * n  # x and the weight in, the normalised x out
    if case.kind == "residual_add":
        return 2 * m * n, m * n
    if case.kind == "add_rmsnorm":
        return 2 * m * n + n, 2 * m * n  # x, the residual and the weight in; the normed sum and the sum out
    if case.kind == "silu_mul":
        return 2 * m * n, m * n  # gate and up in, their product out
    if case.kind == "rotary":
        heads = m * (n + case.kv_heads) * d
        return heads, heads  # q and k in and out (cos and sin are computed, not read)
    if case.kind == "kv_append":
        return 2 * m * n * d, 2 * m * n * d  # k and v in, the same rows of the two caches out
    return m * n, 0  # greedy_pick: the logits in, token ids (int64, counted apart) out


# int64 bytes per token beside the floating tensors: rotary and kv_append read positions, greedy_pick writes ids
INT_READ = {"rotary": POSITION_BYTES, "kv_append": POSITION_BYTES}
INT_WRITTEN = {"greedy_pick": INDEX_BYTES}


def moved_bytes(case: ElementwiseCase) -> tuple[float, float]:
    """(bytes read, bytes written): each input read and each output written once (tensor_elements), plus the int64
    positions rotary and kv_append read and the int64 token ids greedy_pick writes."""
    read, written = tensor_elements(case)
    elem = ELEMENT_BYTES[case.dtype]
    return (float(elem * read + INT_READ.get(case.kind, 0) * case.m),
            float(elem * written + INT_WRITTEN.get(case.kind, 0) * case.m))


def min_bytes(case: ElementwiseCase) -> float:
    """Read each input and write each output once: elem·(read + written), plus int64 positions or token ids."""
    return sum(moved_bytes(case))


# FLOPs per element, stated: rmsnorm square, sum, scale and weight (4 per x element); residual one add; silu_mul
# sigmoid, multiply and the product (~5 per output); rotary two multiplies and an add (3 per q and k element);
# kv_append none (a copy); greedy_pick one compare per logit; add_rmsnorm the add and rmsnorm's four.
FLOPS_PER_ELEMENT = {"rmsnorm": 4, "residual_add": 1, "silu_mul": 5, "rotary": 3, "kv_append": 0, "greedy_pick": 1,
                     "add_rmsnorm": 5}


def flops(case: ElementwiseCase) -> float:
    """FLOPS_PER_ELEMENT times the elements the count runs over (x, the output, q and k, or the logits)."""
    m, n = case.m, case.n
    over = {"rmsnorm": m * n, "residual_add": m * n, "silu_mul": m * n,
            "rotary": m * (n + case.kv_heads) * case.head_dim, "kv_append": 0, "greedy_pick": m * n,
            "add_rmsnorm": m * n}[case.kind]
    return float(FLOPS_PER_ELEMENT[case.kind] * over)
