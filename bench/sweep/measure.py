"""One measuring path for the runner and the pytest-benchmark suite: fit, plan, gate, time, one row."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from ...kernels import Unsupported, inductor, triton_mode
from ...profiles.names import CHECK, SETUP, stage_name
from ...profiles.nvtx_ranges import nvtx_range
from ..instruments import cold as cold_operands
from ..instruments.cold import cold_copies
from ..instruments.gate import Verdict, judge
from ..instruments.memory.poison import poisoned_allocations, scrub
from ..instruments.roofline import Ceilings
from ..instruments.timing import TimerConfig, Timing, one_call, time_call
from ..ops import operator_of
from ..ops.records import ceiling_dtypes, compute_dtype  # noqa: F401 (ceiling_dtypes: the runner's, through here)
from ..spec.roof import MEMORY, WARM, compute_peak, roof_of_row
from ..spec.roof_verdict import (  # noqa: F401 (the runner's and the tests', through here)
    LEVEL_COLUMNS,
    MEMORY_COLUMNS,
    judged,
    judged_at_moments,
    judging_levels,
    roof_finding,
    speed_figures,
    with_ceiling_load,
    with_state,
)

INTERPRETER_SAMPLES = 1  # interpreter timings prove nothing about speed: one sample
# a later round's fewest samples (its median joins the row's figure, the interval comes from the rounds)
LATER_ROUND_SAMPLES = 4
SHARED_BYTES = 4 << 20  # the largest reference a first round hands to its later rounds (Checked.shared)


def impl_mode(impl: str) -> str:
    """How an impl's rows are produced: Triton kernels may run in the interpreter; the rest compiled."""
    return triton_mode.mode() if impl == "triton" else "compiled"


def case_seed(case) -> int:
    return zlib.crc32(repr(case).encode())


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".strip().rstrip(":")


class Sampler(Protocol):
    """Times planned calls taken in turn (copies of one call on cold operands), `evict` run before each one outside
    the clock, then makes the checked call (the next in turn, untimed: its output is `Timing.last`) with
    `before_last` before it and `guard_last` around it; `label` names the clock (it goes in the row's `timer`
    column), `cold` whether host operands that a forward pass streams are timed cold, `flush_l2` whether a GPU's L2
    is flushed before each call."""

    label: str
    cold: bool
    flush_l2: bool

    def __call__(self, calls: Sequence[Callable[[], object]], device: torch.device, *, range_name: str,
                 payload: float, interpreter: bool, evict: Callable[[], None] | None = None,
                 before_last: Callable[[], None] | None = None, guard_last=None) -> Timing: ...


@dataclasses.dataclass(frozen=True)
class HarnessSampler:
    """phasebench's own timers (CUDA events with L2 flush, or perf_counter_ns) under a TimerConfig."""

    config: TimerConfig
    device_type: str

    @property
    def cold(self) -> bool:
        return self.config.cold

    @property
    def flush_l2(self) -> bool:
        return self.device_type == "cuda" and self.config.flush_l2

    @property
    def label(self) -> str:
        if self.device_type != "cuda":
            return "perf_counter_ns+cold" if self.config.cold else "perf_counter_ns"
        return "cuda-graph+events" if self.config.cuda_graph else "cuda-events"

    def __call__(self, calls, device, *, range_name, payload, interpreter, evict=None, before_last=None,
                 guard_last=None):  # an interpreter's (on a GPU): the gate's call warmed it; no interval to aim at
        cfg = self.config if not interpreter else dataclasses.replace(
            self.config, min_samples=INTERPRETER_SAMPLES, max_samples=INTERPRETER_SAMPLES, warmup_s=0.0,
            warmup_calls=0, target=0.0, min_time_s=0.0)
        return time_call(calls, device, cfg, range_name=range_name, payload=payload, evict=evict,
                         before_last=before_last, guard_last=guard_last)


class Checked:
    """One set of inputs of a case with its higher-precision reference and low-precision baseline, built lazily."""

    def __init__(self, op, case, device: torch.device, make_inputs: Callable[[], object]):
        self.op, self.case, self.device, self._make = op, case, device, make_inputs
        self._inputs = self._reference = self._baseline = None

    @property
    def inputs(self):
        if self._inputs is None:
            self._inputs = self._make()
        return self._inputs

    @property
    def reference(self) -> torch.Tensor:
        if self._reference is None:
            self._reference = self.op.reference(self.case, self.inputs, self.device)
        return self._reference

    @property
    def baseline_error(self) -> float | None:
        if self._baseline is None:
            self._baseline = (self.op.baseline_error(self.case, self.inputs, self.reference),)
        return self._baseline[0]

    def judge(self, out) -> Verdict:
        return judge(out, self.reference, self.case.dtype, self.baseline_error, self.op.baseline_cap)

    def shared(self) -> tuple:
        """(the reference as a numpy array, or None, and the baseline's error): what another process's Checked of the
        same case takes (`seed`) instead of computing them again (the inputs are seeded, so they are the same). The
        reference travels only where it is a plain tensor of at most SHARED_BYTES, as bytes through the pipe (a
        tensor would go through shared memory, which a container may hold to 64 MiB); the error always does."""
        ref = self.reference
        small = isinstance(ref, torch.Tensor) and ref.numel() * ref.element_size() <= SHARED_BYTES
        return (ref.detach().cpu().numpy() if small else None), self.baseline_error

    def seed(self, reference, baseline: float | None) -> None:
        self._reference = torch.from_numpy(reference).to(self.device) if reference is not None else self._reference
        self._baseline = (baseline,)


class CaseState:
    """Inputs, reference and low-precision baseline of one case of any operator, built once for every impl: the
    standard inputs, the operator's stress inputs (attention: large logits), and copies of the streamed operands
    for cold host timings."""

    def __init__(self, case, device: torch.device):
        self.case, self.device = case, device
        op = self.op = operator_of(case)
        # the makers close over the op and the standard inputs, never over self: a cycle would keep a case's tensors
        # alive after the next case took its place, until Python's cycle collector ran (rarely, in a sweep)
        standard = self.standard = Checked(op, case, device, functools.partial(op.make_inputs, case, device,
                                                                               case_seed(case)))
        self.stressed = None if op.stress is None else Checked(op, case, device,
                                                               lambda: op.stress(case, standard.inputs))
        self._copies: list = []

    @property
    def resident(self) -> bool:
        """True once the inputs and reference occupy device memory (the fit check then charges impls only)."""
        return self.standard._reference is not None

    @property
    def inputs(self):
        return self.standard.inputs

    @property
    def reference(self) -> torch.Tensor:
        return self.standard.reference

    @property
    def baseline_error(self) -> float | None:
        return self.standard.baseline_error

    def cold_copies(self, names: tuple[str, ...], count: int) -> list:
        """Copies of the inputs with fresh streamed fields, made once for every impl of the case."""
        if len(self._copies) < count - 1:
            self._copies += cold_copies(self.inputs, names, count - len(self._copies))
        return self._copies[:count - 1]


def poison_inputs(state: CaseState, *inputs) -> None:
    """Before a judged call: poison (or restore) what an in-place op must write (Operator.poison_written), and fill
    with NaN what no call may read (Operator.poison_unread: a KV cache past each sequence's length)."""
    for hook in (state.op.poison_written, state.op.poison_unread):
        if hook is not None:
            for x in inputs:
                hook(state.case, x)


def judged_call(state: CaseState, checked: Checked, run: Callable[[], object], clock: list | None = None) -> Verdict:
    """One call judged against `checked`: its inputs poisoned first (poison_inputs), its fresh allocations poisoned
    while it runs, and its output NaN-filled once judged (before its memory goes back to the allocator); its ms
    appended to `clock` where one is given (the poison's fills inside)."""
    with poisoned_allocations():
        poison_inputs(state, checked.inputs)
        start = time.perf_counter_ns()
        out = run()
        sync(state.device)
        if clock is not None:
            clock.append((time.perf_counter_ns() - start) / 1e6)
    verdict = checked.judge(out)
    scrub(out, keep=checked.inputs)
    return verdict


def plain_call(state: CaseState, run: Callable[[], object], inputs) -> Verdict:
    """One call as the timed loop makes it, judged: outside the deterministic mode that poisons allocations (under it
    index_add_, index_put_ with accumulate, scatter_add_ and others take another kernel than the timed calls ran), its
    inputs poisoned first and its output NaN-filled once judged, as every judged call's."""
    poison_inputs(state, inputs)
    out = run()
    sync(state.device)
    verdict = state.standard.judge(out)
    scrub(out, keep=inputs)
    return verdict


def gate(state: CaseState, call, impl: str, clock: list | None = None) -> Verdict:
    """The first call's output on the standard inputs (its ms appended to `clock` where given), then, where the
    operator has them, a call on its stress inputs: the verdict of the first that fails, else the standard one."""
    verdict = judged_call(state, state.standard, call.run, clock)
    if not verdict.ok or state.stressed is None:
        return verdict
    found = judged_call(state, state.stressed,
                        lambda: state.op.prepare(state.case, state.stressed.inputs, impl).run())
    if not found.ok:
        return dataclasses.replace(found, reason=f"{found.reason}, on {state.op.stress_note or 'stress inputs'}")
    return verdict


def base_row(case, impl: str, run_id: str, suite: str, ceil: Ceilings, timer: str) -> dict:
    """A row with the case, its cost and the ceilings filled, no figures yet, status ok. Its roof is the floor of
    the bytes it reads and writes at the measured read and write ceilings (bench.spec.roof); an operator whose cost
    model gives no split puts all its bytes at the copy bandwidth (roof_model "copy"); its compute ceiling is the
    matmul ceiling of what its kernel multiplies in (compute_dtype), which `ceil` must hold (ceiling_dtypes). Until
    `measure` knows how its operands are prepared (with_state) it is judged against memory; "_levels" (not a column)
    carries the ceilings of a warm row at each cache level, with their notes (judging_levels), to it."""
    op = operator_of(case)
    compute = compute_dtype(case, impl, ceil.kind)
    flops = op.flops(case)
    if op.moved_bytes is not None:
        read, written = op.moved_bytes(case)
        nbytes = read + written
    else:
        read, written, nbytes = math.nan, math.nan, op.min_bytes(case)
    row = {
        "run_id": run_id, "device": ceil.device, "device_kind": ceil.kind, "suite": suite,
        "impl": impl, "backend": "", "mode": impl_mode(impl), "shape": case.shape_label, **case.row_fields(),
        "flops": flops, "bytes": nbytes, "intensity": flops / nbytes, "read_bytes": read, "write_bytes": written,
        "latency_ms": math.nan, "latency_p20_ms": math.nan, "latency_p80_ms": math.nan,
        "latency_ci_low_ms": math.nan, "latency_ci_high_ms": math.nan, "latency_ci_rel": math.nan,
        "converged": None, "outliers": None, "samples": 0, "rounds": math.nan, "round_latencies_ms": "",
        "latency_between_low_ms": math.nan, "latency_between_high_ms": math.nan, "latency_between_rel": math.nan,
        "timer": timer, "noisy": False, "noise_reason": "",
        "tflops": math.nan, "gbps": math.nan, "peak_tflops": compute_peak(ceil.peak_tflops, compute),
        "compute_dtype": compute,
        "peak_gbps": ceil.copy_gbps, "read_gbps": ceil.read_gbps, "write_gbps": ceil.write_gbps,
        "pct_roofline": math.nan, "above_roof": False, "roof_moment": "", "pct_roof_low": math.nan,
        "pct_roof_high": math.nan, "roof_verdict": "", "max_rel_err": math.nan, "status": "ok", "reason": "",
        "profiled": False, "cache_state": "", "cold_how": "", "l2_bytes": ceil.caches.get("l2_bytes", math.nan),
        "llc_bytes": ceil.caches.get("llc_bytes", math.nan), "roof_level": MEMORY, "level_read_gbps": math.nan,
        "level_write_gbps": math.nan, "level_copy_gbps": math.nan, "ceiling_drift_pct": math.nan,
        "level_note": "", "compile_s": math.nan, "compile_graphs": math.nan, "compile_cache": "",
        "build_s": math.nan, "recompiles": math.nan, "_levels": judging_levels(ceil),
    }
    roof_tflops, _, bound, model = roof_of_row(row)
    return {**row, "roof_tflops": float(roof_tflops), "bound": str(bound), "roof_model": str(model)}


def _free_cache() -> str:
    """Free the CUDA cache after an OOM; what went wrong doing so (a lost context), for the row's reason."""
    try:
        return torch.cuda.empty_cache() or ""
    except Exception as err:
        return f"; then freeing the cache: {one_line(err)}"


def _sampled(state: CaseState, impl: str, call, row: dict, levels: dict, sampler: Sampler, probe, key: str,
             again: bool) -> tuple[dict, Timing | None]:
    """A row's timed samples on its cold operands, then its checked call (poisoned) and, but in a later round, one
    plain call judged: (the row with its cache state, the timing), or (the incorrect row, None)."""
    device = state.device
    with nvtx_range(stage_name(SETUP, key)):
        timed = cold_operands.plan(state, impl, call, cold=sampler.cold, mode=row["mode"],
                                   flush_l2=getattr(sampler, "flush_l2", False))
    row = {**with_state(row, timed.state, levels), "cold_how": timed.how}
    if again and isinstance(sampler, HarnessSampler):  # a later round: its median, not its interval, joins the row
        sampler = dataclasses.replace(sampler, config=dataclasses.replace(
            sampler.config, min_samples=min(sampler.config.min_samples, LATER_ROUND_SAMPLES)))
    watch = probe.watch() if probe is not None else contextlib.nullcontext()
    graphs = inductor.GraphWatch() if call.compiled is not None else None  # a compiled call's recompiles
    if graphs is not None:  # each cold copy's first call (its bookkeeping) untimed; a recompile there still counts
        for run, inputs in zip(timed.calls[1:], timed.inputs[1:], strict=True):
            scrub(run(), keep=inputs)
    before_last = functools.partial(poison_inputs, state, *timed.inputs)
    before_last = graphs.mark(before_last) if graphs is not None else before_last
    # the checked call after the samples must rewrite what an in-place op writes (poisoned before it) and gets
    # poisoned allocations, so that its output cannot be an earlier call's right answer left in a free block
    with watch as seen:
        timing = sampler(timed.calls, device, range_name=key, payload=row["flops"],
                         interpreter=row["mode"] == "interpreter", evict=timed.evict,
                         before_last=before_last, guard_last=poisoned_allocations)
    if seen is not None and seen.noisy:
        row.update(noisy=True, noise_reason=seen.reason)
    if graphs is not None and (recompiled := graphs.recompiles):
        reason = f"recompiled {recompiled} graph(s) while sampled"
        row.update(noisy=True, noise_reason="; ".join(filter(None, (row.get("noise_reason"), reason))))
    row["recompiles"] = graphs.recompiles if graphs is not None else math.nan
    with nvtx_range(stage_name(CHECK, key)):  # what the timed loop computes is checked too, not only the first
        last = state.standard.judge(timing.last)
        scrub(timing.last, keep=timed.inputs)
        if again:
            row["max_rel_err"] = last.error
        # one plain call after it (untimed): the kernels the timed loop ran, as it ran them; not in a later round, whose
        # code took them in the first (the code switches them, not the process; a recycled block is the process's:
        # the checked call is judged in every round)
        plain = plain_call(state, timed.calls[0], timed.inputs[0]) if last.ok and not again else last
    del timed
    if not last.ok:
        return {**row, "status": last.status, "max_rel_err": last.error,
                "reason": f"the call after the samples: {last.reason}"}, None
    if not plain.ok:
        return {**row, "status": plain.status, "max_rel_err": plain.error,
                "reason": f"the plain call after the samples (no deterministic algorithms): {plain.reason}"}, None
    return row, timing


def measure(state: CaseState, impl: str, row: dict, sampler: Sampler, probe=None) -> dict:
    """Fill `row` for one (case, impl): a skip, a failure, an incorrect result, or the timed figures. Whatever raises
    on the way (the fit check, the kernel, the timer, freeing the cache after an OOM) costs this row only."""
    case, device, op, levels = state.case, state.device, state.op, row.pop("_levels", None) or {}
    # not columns: "_again", a later round of a run (the gate judged this code in the first: its checked call is
    # judged); "_checked", the case's reference and baseline error from the first round (Checked.shared), for a later
    # round; "_share", a first round with later ones returns them so
    again, known, share = row.pop("_again", False), row.pop("_checked", None), row.pop("_share", False)
    try:
        key = op.key(case, impl)
        reason = op.does_not_fit(case, impl, device, resident=state.resident)
        if reason:
            return {**row, "status": "skipped", "reason": reason}
        if known is not None and not state.resident:
            state.standard.seed(*known)
        with nvtx_range(stage_name(SETUP, key)):
            call = op.prepare(case, state.inputs, impl)
        row["backend"] = call.backend
        if call.compiled is not None:  # its first call compiles: untimed, outside the gate's deterministic mode
            if not call.compiled.done:
                scrub(call.run(), keep=state.inputs)
            row.update(call.compiled.columns())
        # Triton's interpreter on the host (seconds a call, not speed): its one timed call is the gate's first, judged
        clock = [] if row["mode"] == "interpreter" and device.type != "cuda" else None
        if not again:
            with nvtx_range(stage_name(CHECK, key)):
                verdict = gate(state, call, impl, clock)
            row["max_rel_err"] = verdict.error
            if not verdict.ok:
                return {**row, "status": verdict.status, "reason": verdict.reason}
        if share:
            row["_checked"] = state.standard.shared()
        if clock:
            row, timing = {**with_state(row, WARM, levels), "cold_how": "warm"}, one_call(clock[0])
        else:
            row, timing = _sampled(state, impl, call, row, levels, sampler, probe, key, again)
            if row["status"] != "ok":
                return row
    except Unsupported as err:
        return {**row, "status": "skipped", "reason": str(err).splitlines()[0] if str(err) else "unsupported"}
    except torch.cuda.OutOfMemoryError as err:
        return {**row, "status": "failed", "reason": "out of memory: " + one_line(err) + _free_cache()}
    except Exception as err:  # a sweep records the failure and goes on
        return {**row, "status": "failed", "reason": one_line(err)}
    try:
        figures = speed_figures(row, timing.median_ms)
    except (ArithmeticError, ValueError) as err:  # a timer that read zero
        return {**row, "status": "failed", "reason": f"figures: {one_line(err)}"}
    row = {**row, **figures, "latency_p20_ms": timing.percentile_ms(20),
           "latency_p80_ms": timing.percentile_ms(80), **timing.columns(),
           "samples": timing.count,
           "samples_ms": list(timing.samples_ms)}  # raw samples: results.parquet keeps them, the CSV does not
    return judged(row)
