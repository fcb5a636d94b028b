"""Linear-layer cases (x [M, K] times w [N, K]), their cost model, and their sweeps over model projections."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields

from ...spec.models import key_values, model_config

LINEAR_PHASES = ("decode", "prefill")
ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class LinearCase:
    """One projection at one M: decode runs it at M = batch, prefill at M = prompt tokens."""

    m: int
    n: int
    k: int
    dtype: str
    phase: str
    model: str = ""
    projection: str = ""

    op = "linear"

    def __post_init__(self):
        for name in ("m", "n", "k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be a positive int, got {value!r}")
        if self.dtype not in ELEMENT_BYTES:
            raise ValueError(f"dtype: must be one of {', '.join(ELEMENT_BYTES)}, got {self.dtype!r}")
        if self.phase not in LINEAR_PHASES:
            raise ValueError(f"phase: must be one of {', '.join(LINEAR_PHASES)}, got {self.phase!r}")

    @property
    def shape_label(self) -> str:
        """Short shape text for tables: gate_up m8 n28672 k4096."""
        return f"{self.projection + ' ' if self.projection else ''}m{self.m} n{self.n} k{self.k}"

    def fields(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def row_fields(self) -> dict:
        """The case's columns in a result row."""
        return {**self.fields(), "op": self.op}


def flops(case: LinearCase) -> float:
    """2·M·N·K: one multiply and one add per weight and token."""
    return 2.0 * case.m * case.n * case.k


def moved_bytes(case: LinearCase) -> tuple[float, float]:
    """(bytes read, bytes written): x and the weights read once, elem·(M·K + N·K); the output written once, elem·M·N."""
    elem = ELEMENT_BYTES[case.dtype]
    return float(elem * (case.m * case.k + case.n * case.k)), float(elem * case.m * case.n)


def min_bytes(case: LinearCase) -> float:
    """Read x and the weights once, write the output once: elem·(M·K + N·K + M·N)."""
    return sum(moved_bytes(case))


def weight_bytes(case: LinearCase) -> float:
    """The weights alone: the floor of any decode step that streams them."""
    return float(ELEMENT_BYTES[case.dtype] * case.n * case.k)


@dataclass(frozen=True)
class LinearSweep:
    """Each named projection of the given models at each M, standing for one phase; in the run's dtype, or in
    `dtype` where the sweep names one (a row that means something in one dtype only)."""

    models: tuple[str, ...]
    m: tuple[int, ...]
    phase: str
    projections: tuple[str, ...] = ("qkv", "o", "gate_up", "down")
    dtype: str | None = None

    def cases(self, dtype: str, models: tuple[str, ...] | None = None) -> list[LinearCase]:
        out = []
        for model, proj, m in itertools.product(models or self.models, self.projections, self.m):
            shapes = model_config(model).projections()
            if proj in shapes:  # a projection the model lacks (a dense model's experts, a mixture's MLP) is left out
                out.append(LinearCase(m, *shapes[proj], self.dtype or dtype, self.phase, model, proj))
        return out


LINEAR_SHAPE_KEYS = ("m", "n", "k", "phase", "projection", "model")


def parse_linear_shape(text: str, dtype: str, model: str | None = None) -> LinearCase:
    """A linear case from `m=8,n=28672,k=4096[,phase=decode]`, or `m=8,projection=gate_up[,model=llama-3-8b]`
    (N and K from the model's projection). Phase defaults to decode for M <= 256, else prefill."""
    values = key_values(text, LINEAR_SHAPE_KEYS, "shape")
    args: dict = {}
    for key in ("m", "n", "k"):
        if key in values:
            try:
                args[key] = int(values[key])
            except ValueError:
                raise ValueError(f"shape: {key} must be an integer, got {values[key]!r}") from None
    name = values.get("model", model)
    proj = values.get("projection", "")
    if proj:
        if name is None:
            raise ValueError(f"shape: projection={proj} needs a model (model=NAME or --model)")
        config = model_config(name)
        if proj not in config.projections():
            raise ValueError(f"shape: unknown projection {proj!r}, choose from {', '.join(config.projections())}")
        n, k = config.projections()[proj]
        args.setdefault("n", n)
        args.setdefault("k", k)
        name = config.name
    missing = [key for key in ("m", "n", "k") if key not in args]
    if missing:
        raise ValueError(f"shape: {text!r} lacks {', '.join(missing)} (give them, or projection= and a model)")
    phase = values.get("phase", "decode" if args["m"] <= 256 else "prefill")
    return LinearCase(args["m"], args["n"], args["k"], dtype, phase, name or "", proj)
