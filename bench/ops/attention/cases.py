"""Attention cases (dense, ragged, paged, sliding-window, with sinks) and their sweeps."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass, fields

from ...spec.models import MODELS, key_values, kind_config, model_config  # noqa: F401  (MODELS: re-exported)

DTYPES = ("float32", "float16", "bfloat16")
KV_DTYPES = ("", "fp8")  # the KV cache's storage: "" the case's dtype, "fp8" e4m3 codes with float32 scales


@dataclass(frozen=True)
class AttentionCase:
    """One attention shape as it flows from a preset through the kernel call into a result row."""

    batch: int
    q_heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    head_dim: int
    causal: bool
    dtype: str
    model: str = ""
    seqlens: tuple[int, ...] | None = None  # ragged decode: sequence b uses keys j < seqlens[b]
    page_size: int = 0  # tokens per page of a paged KV cache read through a block table; 0: contiguous
    window_left: int = -1  # FlashInfer's sliding window: a query at position i sees keys j >= i - window_left
    sinks: bool = False  # a learned logit per query head joins the softmax denominator (gpt-oss)
    kv_dtype: str = ""  # the KV cache's storage: "" (the case's dtype) or "fp8" (e4m3, a float32 scale per KV head)

    op = "attention"

    def __post_init__(self):
        for name in ("batch", "q_heads", "kv_heads", "q_len", "kv_len", "head_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be a positive int, got {value!r}")
        if self.q_heads % self.kv_heads:
            raise ValueError(f"q_heads: must be a multiple of kv_heads, got {self.q_heads} and {self.kv_heads}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.causal and self.q_len > self.kv_len:
            raise ValueError(f"q_len: must not exceed kv_len with causal=True, got {self.q_len} > {self.kv_len}")
        if self.seqlens is not None:
            lens = self.seqlens
            if not isinstance(lens, tuple) or len(lens) != self.batch:
                raise ValueError(f"seqlens: must be a tuple of batch={self.batch} lengths, got {lens!r}")
            low = self.q_len if self.causal else 1
            if any(isinstance(n, bool) or not isinstance(n, int) or not low <= n <= self.kv_len for n in lens):
                raise ValueError(f"seqlens: each length must be an int in [{low}, kv_len={self.kv_len}], got {lens!r}")
        if isinstance(self.page_size, bool) or not isinstance(self.page_size, int) or self.page_size < 0:
            raise ValueError(f"page_size: must be a non-negative int (0: contiguous), got {self.page_size!r}")
        if isinstance(self.window_left, bool) or not isinstance(self.window_left, int) or self.window_left < -1:
            raise ValueError(f"window_left: must be an int >= -1 (-1: no window), got {self.window_left!r}")
        if not isinstance(self.sinks, bool):
            raise ValueError(f"sinks: must be a bool, got {self.sinks!r}")
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype: must be '' (the case's dtype) or 'fp8', got {self.kv_dtype!r}")

    def __repr__(self) -> str:
        # the dataclass repr, page_size, window_left, sinks and kv_dtype shown only when set: repr seeds a case's
        # inputs (sweep.measure.case_seed) and names it in a sweep's id, so other cases keep the seeds they had before
        unset = {"page_size": 0, "window_left": -1, "sinks": False, "kv_dtype": ""}
        shown = (f for f in fields(self) if f.name not in unset or getattr(self, f.name) != unset[f.name])
        return f"{type(self).__qualname__}({', '.join(f'{f.name}={getattr(self, f.name)!r}' for f in shown)})"

    @property
    def lengths(self) -> tuple[int, ...]:
        """The KV length each sequence uses (kv_len for all of them unless ragged)."""
        return self.seqlens if self.seqlens is not None else (self.kv_len,) * self.batch

    @property
    def ragged(self) -> bool:
        return self.seqlens is not None and any(n != self.kv_len for n in self.seqlens)

    @property
    def paged(self) -> bool:
        return self.page_size > 0

    @property
    def windowed(self) -> bool:
        return self.window_left >= 0

    def keys_read(self, length: int) -> int:
        """Keys of a sequence of `length` that some query's window reaches: all of them, or with a window the last
        q_len + window_left (the first query's window and the later queries' own keys)."""
        return min(length, self.q_len + self.window_left) if self.windowed else length

    @property
    def pages(self) -> tuple[int, ...]:
        """Pages each sequence holds (ceil(length / page_size)); empty for a contiguous cache."""
        return tuple(-(-n // self.page_size) for n in self.lengths) if self.paged else ()

    @property
    def max_pages(self) -> int:
        """Columns of the block table: the pages of the cache length kv_len."""
        return -(-self.kv_len // self.page_size) if self.paged else 0

    @property
    def phase(self) -> str:
        if self.q_len == self.kv_len:
            return "prefill"
        if self.q_len == 1:
            return "decode"
        return "chunked_prefill"

    @property
    def shape_label(self) -> str:
        """Short shape text for tables: b1 h32/8 q512 k512 d128."""
        kv = f"k{self.kv_len}" if self.seqlens is None else f"k{sum(self.seqlens) // self.batch}avg{self.kv_len}max"
        return (f"b{self.batch} h{self.q_heads}/{self.kv_heads} q{self.q_len} {kv} "
                f"d{self.head_dim}{' causal' if self.causal else ''}{f' page{self.page_size}' if self.paged else ''}"
                f"{f' w{self.window_left}' if self.windowed else ''}{' sinks' if self.sinks else ''}"
                f"{f' kv-{self.kv_dtype}' if self.kv_dtype else ''}")

    @property
    def seqlens_text(self) -> str:
        """Per-sequence lengths for the row, e.g. '97,1025,3' (empty when not ragged)."""
        return ",".join(map(str, self.seqlens)) if self.seqlens is not None else ""

    def fields(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def row_fields(self) -> dict:
        """The case's columns in a result row (kv_dtype only where set: blank in the rows of a cache in the dtype)."""
        out = {k: v for k, v in self.fields().items() if k != "seqlens" and (k != "kv_dtype" or v)}
        return {**out, "op": self.op, "phase": self.phase, "seqlens": self.seqlens_text,
                "kv_tokens": sum(self.lengths)}


@dataclass(frozen=True)
class Sweep:
    """A cartesian product of sizes for the given model presets; pairs of (q_len, kv_len) or prefixes."""

    models: tuple[str, ...]
    batch: tuple[int, ...]
    causal: tuple[bool, ...] = (True,)
    seq: tuple[int, ...] = ()            # prefill: q_len == kv_len
    chunk: tuple[int, ...] = ()          # chunked prefill / verify: q_len ...
    prefix: tuple[int, ...] = ()         # ... against this many cached keys (kv_len = prefix + chunk)
    kv: tuple[int, ...] = ()             # decode: q_len 1 against kv_len
    pages: tuple[int, ...] = (0,)        # page sizes of the KV cache (0: contiguous)
    kv_dtypes: tuple[str, ...] = ("",)   # KV cache storage ("": the dtype, "fp8"), the same shapes for each

    def lengths(self) -> list[tuple[int, int]]:
        pairs = [(s, s) for s in self.seq]
        pairs += [(c, p + c) for c in self.chunk for p in self.prefix]
        pairs += [(1, n) for n in self.kv]
        return pairs

    def cases(self, dtype: str, models: tuple[str, ...] | None = None) -> list[AttentionCase]:
        out = []
        for model, batch, causal, (q_len, kv_len), page, kv_dtype in itertools.product(
                models or self.models, self.batch, self.causal, self.lengths(), self.pages, self.kv_dtypes):
            m = model_config(model)
            out.append(AttentionCase(batch, m.q_heads, m.kv_heads, q_len, kv_len, m.head_dim, causal, dtype, model,
                                     page_size=page, kv_dtype=kv_dtype))
        return out


@dataclass(frozen=True)
class RaggedSweep:
    """Decode batches whose KV lengths follow a long-tailed (log-normal) law, seeded, capped at kv_max."""

    models: tuple[str, ...]
    batch: tuple[int, ...]
    kv_max: tuple[int, ...]
    median_fraction: float = 0.08  # the median sequence uses this share of kv_max ...
    sigma: float = 1.0             # ... and the log-normal spread gives a few long ones
    seed: int = 0
    pages: tuple[int, ...] = (0,)  # page sizes of the KV cache (0: contiguous), the same lengths for each

    def lengths_for(self, batch: int, kv_max: int) -> tuple[int, ...]:
        rng = random.Random(f"{self.seed}-{batch}-{kv_max}")
        mu = math.log(self.median_fraction * kv_max)
        lens = [min(kv_max, max(1, round(rng.lognormvariate(mu, self.sigma)))) for _ in range(batch)]
        lens[rng.randrange(batch)] = kv_max  # the longest sequence sets the cache length
        return tuple(lens)

    def cases(self, dtype: str, models: tuple[str, ...] | None = None) -> list[AttentionCase]:
        out = []
        for model, batch, kv_max, page in itertools.product(models or self.models, self.batch, self.kv_max,
                                                            self.pages):
            m = model_config(model)
            out.append(AttentionCase(batch, m.q_heads, m.kv_heads, 1, kv_max, m.head_dim, True, dtype, model,
                                     seqlens=self.lengths_for(batch, kv_max), page_size=page))
        return out


@dataclass(frozen=True)
class WindowSweep:
    """A sliding-window model's attention (gpt-oss, bench.spec.models): its window layers (window_left,
    sinks) and its full layers (sinks, no window) at the same shapes; pairs of (q_len, kv_len) as in Sweep."""

    models: tuple[str, ...]
    batch: tuple[int, ...]
    seq: tuple[int, ...] = ()
    chunk: tuple[int, ...] = ()
    prefix: tuple[int, ...] = ()
    kv: tuple[int, ...] = ()
    layers: tuple[str, ...] = ("window", "full")
    pages: tuple[int, ...] = (0,)

    def cases(self, dtype: str, models: tuple[str, ...] | None = None) -> list[AttentionCase]:
        pairs = Sweep((), (), seq=self.seq, chunk=self.chunk, prefix=self.prefix, kv=self.kv).lengths()
        out = []
        for model, batch, (q_len, kv_len), layer, page in itertools.product(
                models or self.models, self.batch, pairs, self.layers, self.pages):
            m = kind_config(model, "window")
            if layer not in ("window", "full"):
                raise ValueError(f"layers: each must be 'window' or 'full', got {layer!r}")
            out.append(AttentionCase(batch, m.q_heads, m.kv_heads, q_len, kv_len, m.head_dim, True, dtype, m.name,
                                     page_size=page, window_left=m.window_left if layer == "window" else -1,
                                     sinks=m.sinks))
        return out


SHAPE_KEYS = ("batch", "q_heads", "kv_heads", "q_len", "kv_len", "head_dim", "causal", "model", "seqlens", "page",
              "window", "sinks", "kv")


def parse_shape(text: str, dtype: str, model: str | None = None) -> AttentionCase:
    """A case from `batch=1,q_heads=32,kv_heads=8,q_len=1,kv_len=65536,head_dim=128[,causal=0][,page=16]`.

    Heads and head dim may come from `model=NAME` (or the --model preset) instead; batch
    defaults to 1 and causal to true. `seqlens=97/1025/3` makes a ragged batch (batch and
    kv_len default to its count and its longest length). `page=16` reads the KV cache in pages
    of 16 tokens through a block table (0, the default: contiguous). `window=127` is a sliding
    window (FlashInfer's window_left; -1, the default: none), `sinks=1` adds a sink logit per head, `kv=fp8`
    stores the KV cache as e4m3 with a scale per KV head.
    """
    values = key_values(text, SHAPE_KEYS, "shape")
    name = values.pop("model", model)
    preset = {}
    if name is not None:
        m = model_config(name)
        name = m.name
        preset = {"q_heads": m.q_heads, "kv_heads": m.kv_heads, "head_dim": m.head_dim}
    args: dict = {"batch": 1, "causal": True, **preset}
    for key, value in values.items():
        if key == "seqlens":
            try:
                args[key] = tuple(int(n) for n in value.split("/"))
            except ValueError:
                raise ValueError(f"shape: seqlens must be lengths separated by '/', got {value!r}") from None
            args.setdefault("kv_len", max(args[key]))
            if "batch" not in values:
                args["batch"] = len(args[key])
        elif key == "kv":
            args["kv_dtype"] = value  # AttentionCase says what it takes
        elif key in ("causal", "sinks"):
            if value.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(f"shape: {key} must be 0/1/true/false, got {value!r}")
            args[key] = value.lower() in ("1", "true", "yes")
        else:
            try:
                args[{"page": "page_size", "window": "window_left"}.get(key, key)] = int(value)
            except ValueError:
                raise ValueError(f"shape: {key} must be an integer, got {value!r}") from None
    missing = [k for k in ("q_heads", "kv_heads", "q_len", "kv_len", "head_dim") if k not in args]
    if missing:
        raise ValueError(f"shape: {text!r} lacks {', '.join(missing)} (give them, or a model)")
    return AttentionCase(dtype=dtype, model=name or "", **args)
