"""MLA decode cases (q against one latent per token, contiguous or paged), their sweep and the cost model as FlashMLA
counts it."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields

from ...spec.models import MODELS, kind_config
from ..attention.cases import DTYPES, AttentionCase
from ..attention.cost import ELEMENT_BYTES, SCALE_BYTES, kv_element_bytes
from ..attention.pages import table_read_bytes

DEFAULT_SCALE = (128 + 64) ** -0.5  # DeepSeek's 1/sqrt(qk_nope + qk_rope) for a case of no preset


@dataclass(frozen=True)
class MLACase:
    """One MLA decode shape: Hq query heads of Sq (1 or 2) tokens against one latent of head_dim dims per token, the
    value its first head_dim_v dims."""

    batch: int
    q_heads: int
    q_len: int
    kv_len: int
    dtype: str
    model: str = ""
    seqlens: tuple[int, ...] | None = None  # ragged decode: sequence b uses keys j < seqlens[b]
    page_size: int = 0  # tokens per page of a paged latent cache; 0: contiguous
    head_dim: int = 576  # the latent: kv_lora_rank + qk_rope_head_dim
    head_dim_v: int = 512  # kv_lora_rank
    kv_dtype: str = ""  # the latent cache's storage: "" (the case's dtype) or "fp8" (e4m3, one float32 scale)

    op = "mla"
    kv_heads = 1  # one latent head, shared by every query head
    causal = True  # bottom-right: the first of two draft tokens sees one key fewer
    window_left = -1
    sinks = False

    def __post_init__(self):
        self.attention  # noqa: B018  (checks the fields an attention case shares, in its one-line errors)
        if self.q_len > 2:
            raise ValueError(f"q_len: must be 1 or 2 (decode, or multi-token prediction), got {self.q_len}")
        if isinstance(self.head_dim_v, bool) or not isinstance(self.head_dim_v, int) \
                or not 0 < self.head_dim_v < self.head_dim:
            raise ValueError(f"head_dim_v: must be an int in [1, head_dim={self.head_dim}), got {self.head_dim_v!r}")

    def __repr__(self) -> str:
        # the dataclass repr, kv_dtype shown only when set: repr seeds a case's inputs, so other cases keep theirs
        shown = (f for f in fields(self) if f.name != "kv_dtype" or self.kv_dtype)
        return f"{type(self).__qualname__}({', '.join(f'{f.name}={getattr(self, f.name)!r}' for f in shown)})"

    @property
    def attention(self) -> AttentionCase:
        """The same shape as an attention case over the latent (one kv head, causal): what the shared pages, gathers
        and the blocked reference read."""
        return AttentionCase(self.batch, self.q_heads, 1, self.q_len, self.kv_len, self.head_dim, True, self.dtype,
                             self.model, self.seqlens, self.page_size, kv_dtype=self.kv_dtype)

    @property
    def scale(self) -> float:
        model = MODELS.get(self.model)
        return model.softmax_scale if model is not None and model.attention == "mla" else DEFAULT_SCALE

    @property
    def phase(self) -> str:
        return "decode"  # one token, or two of multi-token prediction: a decode step either way

    @property
    def lengths(self) -> tuple[int, ...]:
        return self.attention.lengths

    @property
    def paged(self) -> bool:
        return self.page_size > 0

    @property
    def shape_label(self) -> str:
        """Short shape text for tables: b8 h128 q1 k4096 d576/512 mla."""
        kv = f"k{self.kv_len}" if self.seqlens is None else f"k{sum(self.seqlens) // self.batch}avg{self.kv_len}max"
        return (f"b{self.batch} h{self.q_heads} q{self.q_len} {kv} d{self.head_dim}/{self.head_dim_v} mla"
                f"{f' page{self.page_size}' if self.paged else ''}{f' kv-{self.kv_dtype}' if self.kv_dtype else ''}")

    def row_fields(self) -> dict:
        """The case's columns in a result row (kv_heads 1 and causal, as the attention rows carry them)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)
               if f.name != "seqlens" and (f.name != "kv_dtype" or self.kv_dtype)}  # kv_dtype only where set
        return {**out, "op": self.op, "phase": self.phase, "kv_heads": 1, "causal": True,
                "seqlens": self.attention.seqlens_text, "kv_tokens": sum(self.lengths)}


def flops(case: MLACase) -> float:
    """FlashMLA's count: 2 * Sq * sum(seqlens) * Hq * (D + Dv), every (query, key) pair of Q.K^T and P.V (with two
    draft tokens it counts the one pair per sequence the causal mask drops: 1 / (2 * length) too many)."""
    return 2.0 * case.q_len * sum(case.lengths) * case.q_heads * (case.head_dim + case.head_dim_v)


def latent_read_bytes(case: MLACase) -> float:
    """The latent bytes a call reads: sum(seqlens) x D, whatever the cache or the pool holds past each length; an fp8
    latent one byte an element and its one float32 scale."""
    scale = SCALE_BYTES if case.kv_dtype == "fp8" else 0
    return float(kv_element_bytes(case) * sum(case.lengths) * case.head_dim + scale)


def moved_bytes(case: MLACase) -> tuple[float, float]:
    """(read, written) as FlashMLA counts them: the latent cache read once (sum(seqlens) x D, and a paged cache's table
    entries) and q read; the output [B, Hq, Sq, Dv] written."""
    elem = ELEMENT_BYTES[case.dtype]
    rows = case.batch * case.q_heads * case.q_len
    read = latent_read_bytes(case) + elem * rows * case.head_dim + table_read_bytes(case.attention)
    return float(read), float(elem * rows * case.head_dim_v)


def min_bytes(case: MLACase) -> float:
    return sum(moved_bytes(case))


@dataclass(frozen=True)
class MLASweep:
    """MLA decode of the given MLA models (bench.spec.models) at each batch, cache length, Sq and page size."""

    models: tuple[str, ...]
    batch: tuple[int, ...]
    kv: tuple[int, ...]
    q_lens: tuple[int, ...] = (1,)
    pages: tuple[int, ...] = (0,)
    kv_dtypes: tuple[str, ...] = ("",)  # latent storage ("": the dtype, "fp8"), the same shapes for each

    def cases(self, dtype: str, models: tuple[str, ...] | None = None) -> list[MLACase]:
        if dtype not in DTYPES:
            raise ValueError(f"dtype: must be one of {', '.join(DTYPES)}, got {dtype!r}")
        out = []
        for model, batch, kv_len, q_len, page, kv_dtype in itertools.product(
                models or self.models, self.batch, self.kv, self.q_lens, self.pages, self.kv_dtypes):
            m = kind_config(model, "mla")
            out.append(MLACase(batch, m.q_heads, q_len, kv_len, dtype, m.name, page_size=page, head_dim=m.latent_dim,
                               head_dim_v=m.kv_lora_rank, kv_dtype=kv_dtype))
        return out
