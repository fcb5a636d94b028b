"""The runner: for each case and impl, build inputs, check against the reference, time, write one row."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import math
import uuid
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..kernels import Unsupported, prepare, triton_mode
from ..profiles.names import CHECK, SETUP, case_key_for, stage_name
from ..profiles.nvtx_ranges import nvtx_range
from . import cost
from .cases import AttentionCase
from .correctness import TOLERANCE, CaseInputs, make_inputs, reference, relative_error
from .memory import does_not_fit
from .metadata import run_metadata
from .results import ResultsStore
from .roofline import Ceilings, ceilings, on_device
from .timing import TimerConfig, time_call

CPU_TIMER = TimerConfig(warmup_s=0.05, budget_s=0.3, min_samples=5, max_samples=500, flush_l2=False)
CUDA_TIMER = TimerConfig(warmup_s=0.1, budget_s=0.5, min_samples=10, max_samples=1000)
PROFILE_TIMER = TimerConfig(warmup_s=0.0, budget_s=0.05, min_samples=3, max_samples=20)  # a readable trace
INTERPRETER_SAMPLES = 3  # interpreter timings prove nothing about speed: keep them short


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def new_run_id() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]


def impl_mode(impl: str) -> str:
    return triton_mode.mode() if impl == "triton" else "compiled"


def case_seed(case: AttentionCase) -> int:
    return zlib.crc32(repr(case).encode())


@dataclass
class RunConfig:
    """What to measure and where: cases x impls on one device, rows into out_dir."""

    cases: Sequence[AttentionCase]
    impls: Sequence[str]
    device: torch.device
    out_dir: Path
    suite: str = "custom"
    resume: bool = False
    timer: TimerConfig | None = None
    refresh_ceilings: bool = False
    capture: Callable[[], contextlib.AbstractContextManager] | None = field(default=None, repr=False)
    on_row: Callable[[dict, int, int], None] | None = field(default=None, repr=False)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".strip().rstrip(":")


class CaseState:
    """Inputs and reference of one case, built once and shared by every impl."""

    def __init__(self, case: AttentionCase, device: torch.device):
        self.case, self.device = case, device
        self._inputs: CaseInputs | None = None
        self._reference: torch.Tensor | None = None

    @property
    def inputs(self) -> CaseInputs:
        if self._inputs is None:
            self._inputs = make_inputs(self.case, self.device, seed=case_seed(self.case))
        return self._inputs

    @property
    def reference(self) -> torch.Tensor:
        if self._reference is None:
            self._reference = reference(self.case, self.inputs, self.device)
        return self._reference


def base_row(case: AttentionCase, impl: str, run_id: str, suite: str, ceil: Ceilings) -> dict:
    flops, nbytes = cost.flops(case), cost.min_bytes(case)
    inten = flops / nbytes
    peak = ceil.peak_tflops[case.dtype]
    roof = ceil.roof_tflops(case.dtype, inten)
    return {
        "run_id": run_id, "device": ceil.device, "device_kind": ceil.kind, "suite": suite, "model": case.model,
        "impl": impl, "backend": "", "mode": impl_mode(impl), "phase": case.phase,
        "batch": case.batch, "q_heads": case.q_heads, "kv_heads": case.kv_heads, "q_len": case.q_len,
        "kv_len": case.kv_len, "head_dim": case.head_dim, "causal": case.causal, "dtype": case.dtype,
        "flops": flops, "bytes": nbytes, "intensity": inten,
        "latency_ms": math.nan, "latency_p20_ms": math.nan, "latency_p80_ms": math.nan, "samples": 0, "timer": "",
        "tflops": math.nan, "gbps": math.nan, "peak_tflops": peak, "peak_gbps": ceil.peak_gbps,
        "roof_tflops": roof, "pct_roofline": math.nan, "bound": "memory" if roof < peak else "compute",
        "max_rel_err": math.nan, "status": "ok", "reason": "",
    }


def measure(state: CaseState, impl: str, row: dict, timer: TimerConfig) -> dict:
    """Fill `row` for one (case, impl): a skip, a failure, an incorrect result, or the timed figures."""
    case, device = state.case, state.device
    key = case_key_for(case, impl)
    reason = does_not_fit(case, impl, device)
    if reason:
        return {**row, "status": "skipped", "reason": reason}
    try:
        with nvtx_range(stage_name(SETUP, key)):
            x = state.inputs
            call = prepare(x.q, x.k, x.v, impl=impl, causal=case.causal)
        row["backend"] = call.backend
        with nvtx_range(stage_name(CHECK, key)):
            out = call.run()
            sync(device)
            err = relative_error(out, state.reference)
            del out
        row["max_rel_err"] = err
        if not err <= TOLERANCE[case.dtype]:
            limit = TOLERANCE[case.dtype]
            return {**row, "status": "incorrect",
                    "reason": f"max relative error {err:.3g} above the {case.dtype} tolerance {limit:g}"}
        if row["mode"] == "interpreter":
            timer = dataclasses.replace(timer, min_samples=INTERPRETER_SAMPLES, max_samples=INTERPRETER_SAMPLES)
        with nvtx_range(key, payload=row["flops"]):
            timing = time_call(call.run, device, timer)
    except Unsupported as err:
        return {**row, "status": "skipped", "reason": str(err).splitlines()[0] if str(err) else "unsupported"}
    except torch.cuda.OutOfMemoryError as err:
        torch.cuda.empty_cache()
        return {**row, "status": "failed", "reason": "out of memory: " + one_line(err)}
    except Exception as err:  # a sweep records the failure and goes on
        return {**row, "status": "failed", "reason": one_line(err)}
    return {**row, **speed_figures(row, timing.median_ms), "latency_p20_ms": timing.percentile_ms(20),
            "latency_p80_ms": timing.percentile_ms(80), "samples": timing.count, "timer": timing.method}


def speed_figures(row: dict, latency_ms: float) -> dict:
    """Latency, TFLOP/s, GB/s and % of roofline of a row from its median latency."""
    seconds = latency_ms / 1e3
    tflops = row["flops"] / seconds / 1e12
    return {"latency_ms": latency_ms, "tflops": tflops, "gbps": row["bytes"] / seconds / 1e9,
            "pct_roofline": 100 * tflops / row["roof_tflops"]}


def run(cfg: RunConfig):
    """Measure every (case, impl) not already in cfg.out_dir; returns all rows there as a DataFrame."""
    device = cfg.device
    store = ResultsStore(cfg.out_dir, resume=cfg.resume)
    dtypes = sorted({c.dtype for c in cfg.cases})
    ceil = ceilings(device, dtypes, refresh=cfg.refresh_ceilings)
    previous = store.previous_run() if cfg.resume else None
    run_id = previous["run_id"] if previous and "run_id" in previous else new_run_id()
    meta = {"run_id": run_id, "started": (previous or {}).get("started", now()), "finished": None,
            "suite": cfg.suite, **run_metadata(device), "ceilings": ceil.to_json()}
    store.write_run(meta)
    timer = cfg.timer or (CUDA_TIMER if device.type == "cuda" else CPU_TIMER)
    total = len(cfg.cases) * len(cfg.impls)
    index = 0
    capture = cfg.capture() if cfg.capture else contextlib.nullcontext()
    try:
        with on_device(device), capture:  # a profiler records the cases only, not the ceilings or the setup of the run
            for case in cfg.cases:
                state = CaseState(case, device)
                for impl in cfg.impls:
                    index += 1
                    row = base_row(case, impl, run_id, cfg.suite, ceil)
                    if store.is_done(row):
                        continue
                    row = measure(state, impl, row, timer)
                    row["time"] = now()
                    store.append(row)
                    if cfg.on_row:
                        cfg.on_row(row, index, total)
                del state
                if device.type == "cuda":  # cached blocks would count as used in the next case's fit check
                    torch.cuda.empty_cache()
    finally:
        df = store.write_parquet()
        meta["finished"] = now()
        store.write_run(meta)
    return df
