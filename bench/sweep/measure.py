"""One measuring path for the runner and the pytest-benchmark suite: fit, plan, gate, time, one row."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import zlib
from collections.abc import Callable
from typing import Protocol

import torch

from ...kernels import Unsupported, triton_mode
from ...profiles.names import CHECK, SETUP, stage_name
from ...profiles.nvtx_ranges import nvtx_range
from ..instruments.gate import judge
from ..instruments.roofline import Ceilings
from ..instruments.timing import TimerConfig, Timing, time_call
from ..ops import operator_of

INTERPRETER_SAMPLES = 3  # interpreter timings prove nothing about speed: keep them short


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
    """Times a planned call: `label` names the clock (it goes in the row's `timer` column)."""

    label: str

    def __call__(self, fn: Callable[[], object], device: torch.device, *, range_name: str, payload: float,
                 interpreter: bool) -> Timing: ...


@dataclasses.dataclass(frozen=True)
class HarnessSampler:
    """phasebench's own timers (CUDA events with L2 flush, or perf_counter_ns) under a TimerConfig."""

    config: TimerConfig
    device_type: str

    @property
    def label(self) -> str:
        if self.device_type != "cuda":
            return "perf_counter_ns"
        return "cuda-graph+events" if self.config.cuda_graph else "cuda-events"

    def __call__(self, fn, device, *, range_name, payload, interpreter):
        cfg = self.config
        if interpreter:
            cfg = dataclasses.replace(cfg, min_samples=INTERPRETER_SAMPLES, max_samples=INTERPRETER_SAMPLES)
        return time_call(fn, device, cfg, range_name=range_name, payload=payload)


class CaseState:
    """Inputs, reference and low-precision baseline of one case of any operator, built once for every impl."""

    def __init__(self, case, device: torch.device):
        self.case, self.device = case, device
        self.op = operator_of(case)
        self._inputs = None
        self._reference: torch.Tensor | None = None
        self._baseline: tuple[float | None] | None = None

    @property
    def resident(self) -> bool:
        """True once the inputs and reference occupy device memory (the fit check then charges impls only)."""
        return self._reference is not None

    @property
    def inputs(self):
        if self._inputs is None:
            self._inputs = self.op.make_inputs(self.case, self.device, case_seed(self.case))
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


def base_row(case, impl: str, run_id: str, suite: str, ceil: Ceilings, timer: str) -> dict:
    """A row with the case, its cost and the ceilings filled, no figures yet, status ok."""
    op = operator_of(case)
    flops, nbytes = op.flops(case), op.min_bytes(case)
    inten = flops / nbytes
    peak = ceil.peak_tflops[case.dtype]
    roof = ceil.roof_tflops(case.dtype, inten)
    return {
        "run_id": run_id, "device": ceil.device, "device_kind": ceil.kind, "suite": suite,
        "impl": impl, "backend": "", "mode": impl_mode(impl), "shape": case.shape_label, **case.row_fields(),
        "flops": flops, "bytes": nbytes, "intensity": inten,
        "latency_ms": math.nan, "latency_p20_ms": math.nan, "latency_p80_ms": math.nan, "samples": 0,
        "timer": timer, "noisy": False, "noise_reason": "",
        "tflops": math.nan, "gbps": math.nan, "peak_tflops": peak, "peak_gbps": ceil.peak_gbps,
        "roof_tflops": roof, "pct_roofline": math.nan, "bound": "memory" if roof < peak else "compute",
        "max_rel_err": math.nan, "status": "ok", "reason": "", "profiled": False,
    }


def speed_figures(row: dict, latency_ms: float) -> dict:
    """Latency, TFLOP/s, GB/s and % of roofline of a row from its median latency."""
    seconds = latency_ms / 1e3
    tflops = row["flops"] / seconds / 1e12
    gbps = row["bytes"] / seconds / 1e9
    # an op with no arithmetic (a copy) has a zero roof: its share of the roof is its share of the bandwidth
    pct = 100 * tflops / row["roof_tflops"] if row["roof_tflops"] > 0 else 100 * gbps / row["peak_gbps"]
    return {"latency_ms": latency_ms, "tflops": tflops, "gbps": gbps, "pct_roofline": pct}


def measure(state: CaseState, impl: str, row: dict, sampler: Sampler, probe=None) -> dict:
    """Fill `row` for one (case, impl): a skip, a failure, an incorrect result, or the timed figures."""
    case, device, op = state.case, state.device, state.op
    key = op.key(case, impl)
    reason = op.does_not_fit(case, impl, device, resident=state.resident)
    if reason:
        return {**row, "status": "skipped", "reason": reason}
    try:
        with nvtx_range(stage_name(SETUP, key)):
            call = op.prepare(case, state.inputs, impl)
        row["backend"] = call.backend
        with nvtx_range(stage_name(CHECK, key)):
            ref, base = state.reference, state.baseline_error
            out = call.run()
            sync(device)
            verdict = judge(out, ref, case.dtype, base)
            del out
        row["max_rel_err"] = verdict.error
        if not verdict.ok:
            return {**row, "status": "incorrect", "reason": verdict.reason}
        watch = probe.watch() if probe is not None else contextlib.nullcontext()
        with watch as seen:
            timing = sampler(call.run, device, range_name=key, payload=row["flops"],
                             interpreter=row["mode"] == "interpreter")
        if seen is not None and seen.noisy:
            row.update(noisy=True, noise_reason=seen.reason)
    except Unsupported as err:
        return {**row, "status": "skipped", "reason": str(err).splitlines()[0] if str(err) else "unsupported"}
    except torch.cuda.OutOfMemoryError as err:
        torch.cuda.empty_cache()
        return {**row, "status": "failed", "reason": "out of memory: " + one_line(err)}
    except Exception as err:  # a sweep records the failure and goes on
        return {**row, "status": "failed", "reason": one_line(err)}
    return {**row, **speed_figures(row, timing.median_ms), "latency_p20_ms": timing.percentile_ms(20),
            "latency_p80_ms": timing.percentile_ms(80), "samples": timing.count,
            "samples_ms": list(timing.samples_ms)}  # raw samples: results.parquet keeps them, the CSV does not
