"""The correctness gate: an output must have the right shape and dtype and err at most as the dtype allows."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .roofline import TORCH_DTYPES

# fp32 has a fixed relative budget; in fp16/bf16 an output may err at most FACTOR times the error of the same math
# in that dtype (the operator's baseline, written independently of every impl it judges), plus EPS (FlashAttention's
# rule): a fixed budget wide enough for the worst correct case lets a kernel that drops a 64-key block at long
# context through.
FIXED_TOLERANCE = {"float32": 1e-4}
FACTOR = 2.0
EPS = 1e-5
ROW_FLOOR = 1e-3  # a row's own scale, floored at this share of the tensor's largest |ref|
ROUNDOFF = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}  # u, the unit roundoff
# The baseline error a limit may come from is capped per operator, in units of u (Operator.baseline_cap): a sound
# baseline rounds its output once (at most u of a row's largest value) and a few intermediates (attention its
# probabilities, rmsnorm and silu twice, RoPE three times: about 3.8 u at worst; fp32 sums add about nothing). A
# limit may reach FACTOR x the cap: 4 u would let it reach 3.1% in bf16, and pass an attention kernel that drops a
# 64-key block at kv 131072 (2.2%); attention's 2 u keeps it under 1.6%. CAP_UNITS is the default of an operator
# without its own. A baseline above its cap holds no row to more than FACTOR x the cap: an output within that passes,
# one past it is incorrect (its reason says the baseline stood above its cap, in case the cap is the one wrong).
CAP_UNITS = 4.0
BASELINE_CAP = {dtype: CAP_UNITS * u for dtype, u in ROUNDOFF.items()}  # the default caps


@dataclass(frozen=True)
class Verdict:
    """Whether an output passed, its relative error, the limit it was held to, and why not; `judged` is False when
    the gate could not set a limit (a non-finite or capped baseline): the row then fails instead of passing."""

    ok: bool
    error: float
    limit: float
    reason: str = ""
    judged: bool = True

    @property
    def status(self) -> str:
        """The row's status: ok, incorrect (the output is wrong) or failed (the output could not be judged)."""
        return "ok" if self.ok else ("incorrect" if self.judged else "failed")


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
    """The worst row's relative error (see row_errors); the statistic the gate and the baselines share."""
    return float(row_errors(out, ref).max())


def baseline_cap(dtype: str, cap_units: float = CAP_UNITS) -> float:
    """The largest baseline error a limit in `dtype` comes from: `cap_units` units of its roundoff (inf in fp32)."""
    return cap_units * ROUNDOFF[dtype] if dtype in ROUNDOFF else math.inf


def baseline_problem(dtype: str, baseline_error: float, cap_units: float = CAP_UNITS) -> str | None:
    """Why `baseline_error` alone cannot set the limit in `dtype` (not finite, or above its cap); None if sound."""
    if not math.isfinite(baseline_error):
        return f"the {dtype} baseline errs {baseline_error:.3g}: not finite, so no limit can be set"
    cap = baseline_cap(dtype, cap_units)
    if baseline_error > cap:
        return (f"the {dtype} baseline errs {baseline_error:.3g}, above its cap {cap:.3g} ({cap_units:g} units of "
                f"{dtype} roundoff)")
    return None


def limit_for(dtype: str, baseline_error: float | None, cap_units: float = CAP_UNITS) -> float:
    """The largest relative error a correct output may have in `dtype`: fixed in fp32, else FACTOR x the baseline's
    error (at most its cap) + EPS; ValueError, with one line, when the baseline is missing or not finite (never an
    infinite limit)."""
    if dtype in FIXED_TOLERANCE:
        return FIXED_TOLERANCE[dtype]
    if baseline_error is None:
        raise ValueError(f"baseline_error: needed for {dtype} (the error of the same math in that dtype)")
    if not math.isfinite(baseline_error):
        raise ValueError(f"baseline_error: {baseline_problem(dtype, baseline_error)}")
    return FACTOR * min(baseline_error, baseline_cap(dtype, cap_units)) + EPS


def _output_problem(out, reference: torch.Tensor, dtype: torch.dtype | None) -> str | None:
    """Why `out` cannot be compared with `reference`: not a tensor, another shape, not `dtype` (None: any), NaN or
    inf; None if it can."""
    if not isinstance(out, torch.Tensor):
        return f"output is a {type(out).__name__}, not a tensor"
    if tuple(out.shape) != tuple(reference.shape):
        return f"output shape {tuple(out.shape)} differs from the expected {tuple(reference.shape)}"
    if dtype is not None and out.dtype != dtype:
        return f"output dtype {out.dtype} differs from the input dtype {str(dtype).removeprefix('torch.')}"
    if out.is_floating_point() and not bool(torch.isfinite(out).all()):
        return "output holds NaN or inf"
    return None


def judge(out, reference: torch.Tensor, dtype: str, baseline_error: float | None = None,
          cap_units: float = CAP_UNITS) -> Verdict:
    """Check shape, dtype, finiteness and error of `out` against the higher-precision `reference`, in fp16/bf16 against
    a limit from a finite baseline capped at `cap_units` (the operator's); a non-finite baseline cannot be judged
    (failed, with the reason)."""
    expected = TORCH_DTYPES[dtype]
    if isinstance(reference, Viewed):
        try:
            out = reference.view(out)
        except ValueError as err:
            return Verdict(False, float("inf"), 0.0, str(err).splitlines()[0] if str(err) else "unviewable output")
        reference, expected = reference.tensor, None  # the view checked the output's tensors
    problem = _output_problem(out, reference, expected)
    if problem:
        return Verdict(False, float("inf"), 0.0, problem)
    err = relative_error(out, reference)
    problem = None if dtype in FIXED_TOLERANCE or baseline_error is None else baseline_problem(dtype, baseline_error,
                                                                                               cap_units)
    if problem and not math.isfinite(baseline_error):
        return Verdict(False, err, math.nan, problem, judged=False)
    limit = limit_for(dtype, baseline_error, cap_units)
    if err <= limit:
        return Verdict(True, err, limit)
    if dtype in FIXED_TOLERANCE:
        return Verdict(False, err, limit, f"worst row's relative error {err:.3g} above the {dtype} limit {limit:.3g}")
    if problem is None:
        return Verdict(False, err, limit, f"worst row's relative error {err:.3g} above the {dtype} limit {limit:.3g} "
                                          f"({FACTOR:g} x the {dtype} baseline's error {baseline_error:.3g} + {EPS:g})")
    return Verdict(False, err, limit, f"worst row's relative error {err:.3g} above the {dtype} limit {limit:.3g} "
                                      f"({FACTOR:g} x the cap + {EPS:g}; {problem}: a right kernel errs about as its "
                                      "baseline, and one past twice the cap is wrong, or the cap too tight for it)")
