"""The operator record: what the measuring path needs of one operator, and the registry the harness reads them from."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...kernels import get_impl
from ..instruments.ceiling_measures import TORCH_DTYPES
from ..instruments.gate import CAP_UNITS

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Operator:
    """What the measuring path needs to know of one operator; adding an operator adds one of these."""

    name: str
    case_type: type
    flops: Callable[[object], float]
    min_bytes: Callable[[object], float]
    make_inputs: Callable[[object, torch.device, int], object]
    reference: Callable[[object, object, torch.device], torch.Tensor]
    # (case, inputs, reference) -> the error of the same math in the case's low-precision dtype, written
    # independently of every registered impl (the gate's limit is a multiple of it); None: the dtype's fixed limit
    baseline_error: Callable[[object, object, torch.Tensor], float | None]
    prepare: Callable[[object, object, str], object]  # (case, inputs, impl) -> a planned call
    does_not_fit: Callable[..., str | None]  # (case, impl, device, *, resident, free)
    key: Callable[[object, str], str]  # the NVTX name of (case, impl)
    # fields of the inputs that a forward pass streams from memory (weights, the KV cache): cold on the host
    streamed: tuple[str, ...] = ()
    # case -> bytes one call reads of its streamed operands where that is less than their size (a window reads the last
    # keys of a cache, a ragged or paged batch the keys each sequence holds): what a cold rotation counts; None: their
    # size
    streamed_read: Callable[[object], float] | None = None
    # (case, inputs) -> inputs that stress the kernel where standard-normal inputs cannot (attention: large logits),
    # checked after the standard inputs; None for an operator without such a regime
    stress: Callable[[object, object], object] | None = None
    stress_note: str = ""  # what the stress inputs are, for the reason of a row that fails on them
    # (case, inputs) -> None, for an op that writes into its inputs in place (kv_append): poisons (or restores, where
    # the op also reads it) what a call must write, run before every judged call (the gate's and the last timed
    # one), so that a call which skips a write fails whatever an earlier call left there; None: out of place only
    poison_written: Callable[[object, object], None] | None = None
    # (case, inputs) -> None, for an op whose inputs hold memory no call may read (a KV cache past each sequence's
    # length, where a server's pool keeps stale values): fills it with NaN, in place, before every judged call, so
    # that a kernel which reads it fails (a masked score still multiplies its value: 0 x NaN is NaN); the reference
    # and the baseline never read it. None: a call may read all of its inputs
    poison_unread: Callable[[object, object], None] | None = None
    # case -> (bytes read, bytes written), summing to min_bytes: the row's roof is the floor of each at its measured
    # ceiling (bench.spec.roof); None: an operator that does not split them, whose roof puts min_bytes at the copy
    # bandwidth (its rows say so in roof_model)
    moved_bytes: Callable[[object], tuple[float, float]] | None = None
    # the most its sound baseline errs, in units of the dtype's roundoff: no fp16/bf16 limit reaches past FACTOR x it
    # (bench.instruments.gate), so it must stay under the error of the smallest bug the gate must catch
    baseline_cap: float = CAP_UNITS


OPERATORS: dict[str, Operator] = {}
_found: list[str] = []  # the operator packages of bench.ops whose record modules are imported


def register_operator(op: Operator) -> Operator:
    """Put an operator's record where the runner, the store, the CLI and pytest bench find it by `case.op`."""
    if op.name in OPERATORS and OPERATORS[op.name] is not op:
        raise ValueError(f"op: an operator named {op.name!r} is registered already")
    if getattr(op.case_type, "op", None) != op.name:
        raise ValueError(f"case_type: {op.case_type.__name__}.op must be {op.name!r}")
    OPERATORS[op.name] = op
    return op


def operators() -> dict[str, Operator]:
    """Every operator's record by name: the built-in ones (each package of bench.ops with a record module, imported
    on first use, so that a case module stays light) and any registered since (plugins)."""
    if not _found:
        package = importlib.import_module(__package__)
        for info in pkgutil.iter_modules(package.__path__):
            if info.ispkg:
                importlib.import_module(f"{__package__}.{info.name}.record")
                _found.append(info.name)
    return OPERATORS


def operator_of(case) -> Operator:
    try:
        return operators()[case.op]
    except (AttributeError, KeyError):
        raise ValueError(f"case: {case!r} is not a case of a known operator ({', '.join(OPERATORS)})") from None


def compute_dtype(case, impl: str, device_type: str) -> str:
    """What `impl` multiplies in on `case` (its declaration in the kernel registry, kernels.registry.Impl.compute,
    given the case's row fields); the case's dtype for a name the registry does not hold."""
    try:
        chosen = get_impl(impl, case.op)
    except ValueError:
        return case.dtype
    return chosen.compute_dtype(device_type, TORCH_DTYPES[case.dtype], case.row_fields())


def ceiling_dtypes(pairs, device_type: str) -> tuple[str, ...]:
    """The dtypes whose matmul ceilings the (case, impl) pairs are held to: every dtype their kernels multiply in."""
    return tuple(sorted({part for case, impl in pairs for part in compute_dtype(case, impl, device_type).split("+")}))
