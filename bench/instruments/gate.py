"""The correctness gate: an output must have the right shape and dtype and err at most as the dtype allows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .roofline import TORCH_DTYPES

# fp32 has a fixed relative budget; in fp16/bf16 an output may err at most FACTOR times the error of
# the same naive math in that dtype, plus EPS (FlashAttention's rule): a fixed budget wide enough
# for the worst correct case lets a kernel that drops a 64-key block at long context through.
FIXED_TOLERANCE = {"float32": 1e-4}
FACTOR = 2.0
EPS = 1e-5
ROW_FLOOR = 1e-3  # a row's own scale, floored at this share of the tensor's largest |ref|


@dataclass(frozen=True)
class Verdict:
    """Whether an output passed, its relative error, the limit it was held to, and why not."""

    ok: bool
    error: float
    limit: float
    reason: str = ""


@dataclass(frozen=True)
class Viewed:
    """A reference for an output that is not one tensor in the case's dtype (a tuple, indices): the gate
    applies `view` to the output, outside the timed call, and judges the tensor it gives against `tensor`.
    `view` raises ValueError, with one line, for an output it cannot take."""

    tensor: torch.Tensor
    view: Callable[[object], torch.Tensor]


def row_errors(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per output row (the last dimension: one (sequence, head, query) row of attention, one token's output of a
    linear layer): max |out - ref| over the row / max |ref| of the row, so rows that see few keys (outputs near 1)
    never set the budget of rows that see thousands (outputs near 0.01). A row whose reference is all but zero is
    held to ROW_FLOOR x the largest |ref| instead; NaN or inf anywhere makes every row infinite."""
    diff = out.to(ref.dtype, copy=True)  # never the output itself (an fp32 output beside an fp32 reference)
    diff.sub_(ref).abs_()  # in place: the check holds two reference-sized temporaries (device_memory.CHECK_COPIES)
    if not torch.isfinite(diff).all():
        return torch.full(ref.shape[:-1] or (1,), float("inf"), dtype=ref.dtype, device=ref.device)
    worst = diff.amax(dim=-1) if diff.dim() else diff.reshape(1)
    del diff
    scale = ref.abs().amax(dim=-1) if ref.dim() else ref.abs().reshape(1)
    return worst / scale.clamp(min=ROW_FLOOR * float(scale.max()) or torch.finfo(ref.dtype).tiny)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """The worst row's relative error (see row_errors); the statistic the gate and its naive baseline share."""
    return float(row_errors(out, ref).max())


def limit_for(dtype: str, baseline_error: float | None) -> float:
    """The largest relative error a correct output may have in `dtype`."""
    if dtype in FIXED_TOLERANCE:
        return FIXED_TOLERANCE[dtype]
    if baseline_error is None:
        raise ValueError(f"baseline_error: needed for {dtype} (the naive error in that dtype)")
    return FACTOR * baseline_error + EPS


def judge(out, reference: torch.Tensor, dtype: str, baseline_error: float | None = None) -> Verdict:
    """Check shape, dtype, finiteness and error of `out` against the higher-precision `reference`."""
    if isinstance(reference, Viewed):
        try:
            out = reference.view(out)
        except ValueError as err:
            return Verdict(False, float("inf"), 0.0, str(err).splitlines()[0] if str(err) else "unviewable output")
        reference = reference.tensor
    if not isinstance(out, torch.Tensor):
        return Verdict(False, float("inf"), 0.0, f"output is a {type(out).__name__}, not a tensor")
    if tuple(out.shape) != tuple(reference.shape):
        return Verdict(False, float("inf"), 0.0,
                       f"output shape {tuple(out.shape)} differs from the expected {tuple(reference.shape)}")
    if out.dtype != TORCH_DTYPES[dtype]:
        return Verdict(False, float("inf"), 0.0, f"output dtype {out.dtype} differs from the input dtype {dtype}")
    limit = limit_for(dtype, baseline_error)
    err = relative_error(out, reference)
    if not err <= limit:
        rule = (f"the {dtype} limit {limit:.3g}" if dtype in FIXED_TOLERANCE else
                f"the {dtype} limit {limit:.3g} ({FACTOR:g} x naive {dtype} error {baseline_error:.3g} + {EPS:g})")
        return Verdict(False, err, limit, f"worst row's relative error {err:.3g} above {rule}")
    return Verdict(True, err, limit)
