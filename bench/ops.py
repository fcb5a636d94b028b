"""Each operator's record for the harness: its case type, cost, inputs, reference, baseline, call and memory charge."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..kernels import prepare, prepare_linear
from ..profiles.names import case_key_for, elementwise_key_for, linear_key_for
from . import correctness, cost, elementwise_cases, elementwise_check, linear_cases, linear_check, memory
from .cases import AttentionCase
from .elementwise_cases import ElementwiseCase
from .linear_cases import LinearCase


@dataclass(frozen=True)
class Operator:
    """What the measuring path needs to know of one operator; adding an operator adds one of these."""

    name: str
    case_type: type
    flops: Callable[[object], float]
    min_bytes: Callable[[object], float]
    make_inputs: Callable[[object, torch.device, int], object]
    reference: Callable[[object, object, torch.device], torch.Tensor]
    baseline_error: Callable[[object, object, torch.Tensor], float | None]  # None: the dtype's fixed limit
    prepare: Callable[[object, object, str], object]  # (case, inputs, impl) -> a planned call
    does_not_fit: Callable[..., str | None]  # (case, impl, device, *, resident, free)
    key: Callable[[object, str], str]  # the NVTX name of (case, impl)


ATTENTION = Operator(
    name="attention", case_type=AttentionCase, flops=cost.flops, min_bytes=cost.min_bytes,
    make_inputs=correctness.make_inputs, reference=correctness.reference,
    baseline_error=correctness.baseline_error,
    prepare=lambda case, x, impl: prepare(x.q, x.k, x.v, impl=impl, causal=case.causal,
                                          cache_seqlens=x.cache_seqlens),
    does_not_fit=memory.does_not_fit, key=case_key_for,
)
LINEAR = Operator(
    name="linear", case_type=LinearCase, flops=linear_cases.flops, min_bytes=linear_cases.min_bytes,
    make_inputs=linear_check.make_inputs, reference=linear_check.reference,
    baseline_error=linear_check.baseline_error,
    prepare=lambda case, x, impl: prepare_linear(x.x, x.w, impl=impl),
    does_not_fit=linear_check.does_not_fit, key=linear_key_for,
)
ELEMENTWISE = Operator(
    name="elementwise", case_type=ElementwiseCase, flops=elementwise_cases.flops,
    min_bytes=elementwise_cases.min_bytes, make_inputs=elementwise_check.make_inputs,
    reference=elementwise_check.reference, baseline_error=elementwise_check.baseline_error,
    prepare=elementwise_check.prepare, does_not_fit=elementwise_check.does_not_fit, key=elementwise_key_for,
)
OPERATORS: dict[str, Operator] = {op.name: op for op in (ATTENTION, LINEAR, ELEMENTWISE)}


def operator_of(case) -> Operator:
    try:
        return OPERATORS[case.op]
    except (AttributeError, KeyError):
        raise ValueError(f"case: {case!r} is not a case of a known operator ({', '.join(OPERATORS)})") from None
