"""Quantized linear cases (x [M, K] times a packed weight [N, K]), their cost model, their sweeps over projections."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields

from ...spec.models import model_config
from ...spec.quant import QUANT_SCHEMES, quant_scheme
from ..linear.cases import ELEMENT_BYTES, LINEAR_PHASES, LinearSweep


@dataclass(frozen=True)
class QLinearCase:
    """One projection at one M with its weight packed by `scheme`; x, the scales and the output in `dtype`."""

    m: int
    n: int
    k: int
    scheme: str
    dtype: str
    phase: str
    model: str = ""
    projection: str = ""

    op = "qlinear"

    def __post_init__(self):
        for name in ("m", "n", "k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be a positive int, got {value!r}")
        info = quant_scheme(self.scheme)
        if self.dtype not in ELEMENT_BYTES:
            raise ValueError(f"dtype: must be one of {', '.join(ELEMENT_BYTES)}, got {self.dtype!r}")
        if self.phase not in LINEAR_PHASES:
            raise ValueError(f"phase: must be one of {', '.join(LINEAR_PHASES)}, got {self.phase!r}")
        if info.group and info.bits == 4 and self.k < info.group:  # the 4-bit packings pad K to whole groups
            raise ValueError(f"k: must be at least the group size {info.group} of {self.scheme}, got {self.k}")

    @property
    def bits_per_weight(self) -> float:
        """Stored bits per weight, scales and zeros included (in the activation dtype)."""
        return quant_scheme(self.scheme).bits_per_weight(self.n, self.k, ELEMENT_BYTES[self.dtype])

    @property
    def shape_label(self) -> str:
        """Short shape text for tables: gate_up m1 n28672 k4096 int4-g128 4.25b."""
        return (f"{self.projection + ' ' if self.projection else ''}m{self.m} n{self.n} k{self.k} {self.scheme} "
                f"{self.bits_per_weight:.3g}b")

    def fields(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def row_fields(self) -> dict:
        """The case's columns in a result row."""
        return {**self.fields(), "op": self.op}


def flops(case: QLinearCase) -> float:
    """2·M·N·K: one multiply and one add per weight and token (dequantization is not counted as useful work)."""
    return 2.0 * case.m * case.n * case.k


def weight_bytes(case: QLinearCase) -> float:
    """The packed weight with its scales and zeros: what every decode step streams."""
    return quant_scheme(case.scheme).stored_bytes(case.n, case.k, ELEMENT_BYTES[case.dtype])


def moved_bytes(case: QLinearCase) -> tuple[float, float]:
    """(bytes read, bytes written): the packed weight, its scales and zeros and x read once; the output written once."""
    elem = ELEMENT_BYTES[case.dtype]
    return weight_bytes(case) + float(elem * case.m * case.k), float(elem * case.m * case.n)


def min_bytes(case: QLinearCase) -> float:
    return sum(moved_bytes(case))


@dataclass(frozen=True)
class QLinearSweep:
    """Each named projection of the given models at each M, for each scheme, standing for one phase; in the run's
    dtype, or in `dtype` where the sweep names one."""

    models: tuple[str, ...]
    m: tuple[int, ...]
    phase: str
    projections: tuple[str, ...] = ("qkv", "o", "gate_up", "down")
    schemes: tuple[str, ...] = tuple(QUANT_SCHEMES)
    dtype: str | None = None

    def cases(self, dtype: str, models: tuple[str, ...] | None = None) -> list[QLinearCase]:
        out = []
        for model, proj, m, scheme in itertools.product(models or self.models, self.projections, self.m, self.schemes):
            shapes = model_config(model).projections()
            if proj in shapes:  # as LinearSweep: a projection the model lacks is left out
                out.append(QLinearCase(m, *shapes[proj], scheme, self.dtype or dtype, self.phase, model, proj))
        return out


def quant_sweeps(models: tuple[str, ...], m: tuple[int, ...], projections: tuple[str, ...],
                 schemes: tuple[str, ...] = tuple(QUANT_SCHEMES), dtype: str | None = None) -> list:
    """The same projections unquantized (linear cases, `scheme` blank in their rows) and packed by each scheme, in
    the run's dtype or in `dtype`."""
    return [LinearSweep(models, m, "decode", projections, dtype),
            QLinearSweep(models, m, "decode", projections, schemes, dtype)]
