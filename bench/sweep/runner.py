"""The runner: a sweep of cases x impls on one device through the measuring path, one row at a time."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import torch

from ...kernels import OPS, triton_mode
from ..instruments.ceiling_drift import DRIFT_FLAG, drift_warning, moment, record, spread
from ..instruments.cold import policy as cold_policy
from ..instruments.timing import CI_TARGETS, WARMUP_WINDOWS, WINDOW_CALLS, TimerConfig
from ..ops import operator_of
from ..spec.interval import STOP_REASONS
from ..spec.store.files import WriteError
from .executor import Executor
from .measure import (
    INTERPRETER_SAMPLES,
    HarnessSampler,
    base_row,
    ceiling_dtypes,
    impl_mode,
    one_line,
    with_ceiling_load,
)
from .results import ResultsStore, row_key
from .rounds import RoundBook, SweepRounds, rounds_rule
from .worker import IN_PROCESS, Isolation

# Sampling stops once the median's 95% interval is within the device's target (after min_samples and min_time_s), or
# at the time limit (budget_s). Six samples are the fewest whose extremes hold the median with 95%: fewer, no interval.
# A warm-up of 0.15 s at least (0.2 s on a GPU), on to 0.3 s (0.4 s) while its timings are not steady: its windows
# of 0.05 s see a drift that fades over about 0.1 s (with a 4% warm-up slowness of that kind 90% of the host's
# intervals hold the steady median, 0% after a fixed 0.05 s: tests/bench/instruments/test_timing.py simulates it).
# Each round of a run warms up again, in its fresh process.
CPU_TIMER = TimerConfig(warmup_s=0.15, budget_s=0.3, min_samples=6, max_samples=500, flush_l2=False, cold=True,
                        target=CI_TARGETS["cpu"], min_time_s=0.05, max_warmup_s=0.3)
CUDA_TIMER = TimerConfig(warmup_s=0.2, budget_s=0.5, min_samples=10, max_samples=2000, target=CI_TARGETS["cuda"],
                         min_time_s=0.05, max_warmup_s=0.4)
PROFILE_TIMER = TimerConfig(warmup_s=0.0, budget_s=0.05, min_samples=3, max_samples=20)  # a readable trace


def default_timer(device: torch.device, *, cuda_graph: bool = False, sample_time: float | None = None,
                  warm: bool = False, ci_target: float | None = None) -> TimerConfig:
    """The runner's timer for a device: CUDA events (graph replays on request) or the host clock with cold streamed
    operands (warm caches with `warm`); `sample_time` replaces the time limit of the samples per (case, impl) (and
    caps the minimum time), `ci_target` the relative half-width of the median's interval that stops sampling."""
    timer = CUDA_TIMER if device.type == "cuda" else CPU_TIMER
    if cuda_graph:
        timer = dataclasses.replace(timer, cuda_graph=True)
    if warm:
        timer = dataclasses.replace(timer, cold=False)
    if sample_time is not None:
        timer = dataclasses.replace(timer, budget_s=sample_time, min_time_s=min(timer.min_time_s, sample_time))
    if ci_target is not None:
        timer = dataclasses.replace(timer, target=ci_target)
    return timer


def sampling_rule(timer: TimerConfig) -> dict:
    """How a row's samples were taken and summarised, for run.json."""
    return {"statistic": "median", "interval": "95% of the median, from the binomial ranks of its order statistics",
            "warm_up": f"in windows of min_warmup_s / {WARMUP_WINDOWS} ({WINDOW_CALLS} calls at least), past "
                       "min_warmup_s until steady (the medians of the latest window and of the one "
                       f"{WARMUP_WINDOWS - 1} before it each inside the other's 95% interval) or max_warmup_s",
            "min_warmup_s": timer.warmup_s, "max_warmup_s": timer.max_warmup_s,
            "target_rel_half_width": timer.target, "min_samples": timer.min_samples, "min_time_s": timer.min_time_s,
            "halves": "the target stops sampling only where the 95% intervals of the medians of the first and the "
                      "second half of the samples (in time order) overlap; a limit reached where they do not is "
                      "drifting", "stop_reasons": list(STOP_REASONS),
            "time_limit_s": timer.budget_s, "max_samples": timer.max_samples,
            "outliers": "beyond Q1 - 1.5 IQR or Q3 + 1.5 IQR, counted, never removed",
            "interpreter_samples": INTERPRETER_SAMPLES}


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def new_run_id() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]


@dataclass
class RunConfig:
    """What to measure and where: cases x impls on one device, rows into out_dir.

    Cases may be of any operator; each runs with the named impls that its operator has."""

    cases: Sequence
    impls: Sequence[str] | dict[str, Sequence[str]]
    device: torch.device
    out_dir: Path
    suite: str = "custom"
    resume: bool = False
    retry_failed: bool = False
    timer: TimerConfig | None = None
    refresh_ceilings: bool = False
    profiled: bool = False  # rows measured under a profiler: marked, and left out of reports by default
    detect_contention: bool = True
    time_budget_s: float | None = None  # wall seconds for the sweep; rows that would overrun it are skipped
    started: float | None = None  # time.monotonic() the budget counts from (default: when run() starts)
    capture: Callable[[], contextlib.AbstractContextManager] | None = field(default=None, repr=False)
    on_row: Callable[[dict, int, int], None] | None = field(default=None, repr=False)
    retry_noisy: int = 0  # rounds, at the end of the sweep, that measure again the rows timed on a busy machine
    rounds: int = 1  # times the whole plan is measured
    # combine_rounds: each round after the first in a fresh worker process and an order of its own, after a probe of
    # the ceilings, and the rounds of a (case, impl) combined into its one row (bench.sweep.rounds); else each round
    # appends its rows (repeats that the phases check reads round by round)
    combine_rounds: bool = False
    # called as between_rounds(executor, k) before the first round, between rounds and after the last (rounds + 1
    # calls): what the sweep is interleaved with, on the sweep's own device and worker
    between_rounds: Callable[[Executor, int], None] | None = field(default=None, repr=False)
    # in a worker process (bench.sweep.worker) that a crash or a hang costs one failed row, or in this one; the
    # worker imports the plugins itself, so kernels registered only in this process are not there
    isolation: Isolation = IN_PROCESS


def impls_for(case, impls) -> list[str]:
    """The impls of `impls` that the case's operator has (naive serves every operator, flash attention only);
    `impls` may also map each operator to its own list."""
    names = impls.get(case.op, ()) if isinstance(impls, dict) else impls
    return [name for name in names if name in OPS[case.op]]


def measurement_options(device: torch.device, timer: TimerConfig, profiled: bool) -> dict:
    """What must be equal for rows of two invocations to be one measurement (checked by --resume)."""
    return {"device": str(device), "triton_mode": triton_mode.mode(), "timer": dataclasses.asdict(timer),
            "profiled": profiled}


def sweep_of(cfg: RunConfig) -> dict:
    """What a results folder holds, for --resume: the suite, the cases' dtypes and models, and the impls."""
    names = sorted({i for c in cfg.cases for i in impls_for(c, cfg.impls)})
    return {"suite": cfg.suite, "dtypes": sorted({c.dtype for c in cfg.cases}),
            "models": sorted({getattr(c, "model", "") for c in cfg.cases}), "impls": names}


def _joined(sweep: dict, previous: dict | None) -> dict:
    """The folder's sweep after a resume: its suite, dtypes and models (a resume keeps them), every impl so far."""
    before = (previous or {}).get("selection") or {}
    return {**sweep, "impls": sorted({*sweep["impls"], *(before.get("impls") or ())})}


def spread_order(n: int) -> list[int]:
    """0..n-1 in bit-reversed (van der Corput) order: any prefix is spread over the whole range, so a sweep cut
    short by its time budget still samples every part of it."""
    bits = max(1, (n - 1).bit_length())
    return sorted(range(n), key=lambda i: int(f"{i:0{bits}b}"[::-1], 2))


class TimeBudget:
    """A sweep's wall-clock allowance: a row starts only when the time left exceeds the longest row of its impl so
    far (impls differ by orders of magnitude: an interpreter row against a compiled one) leaving out its first,
    which carries the compile and autotuning; until an impl has two rows, the median row so far, or the timer's
    warm-up plus sampling."""

    def __init__(self, seconds: float, timer: TimerConfig, start: float | None = None):
        self.seconds, self.start = seconds, time.monotonic() if start is None else start
        self.floor = timer.warmup_s + timer.budget_s
        self.durations: dict[str, list[float]] = {}

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.start)

    def expected(self, impl: str) -> float:
        mine = self.durations.get(impl, [])
        if len(mine) >= 2:
            return max(mine[1:])
        every = [d for ds in self.durations.values() for d in ds]
        return statistics.median(every) if every else self.floor

    def refusal(self, impl: str) -> str | None:
        """Why the next row of `impl` must not start, or None when it fits."""
        left, expected = self.left(), self.expected(impl)
        if left >= expected:
            return None
        return (f"time budget: {max(left, 0):.1f} s of {self.seconds:g} s left, a {impl} row takes about "
                f"{expected:.1f} s (--resume --retry-failed measures it later)")

    def record(self, impl: str, seconds: float) -> None:
        self.durations.setdefault(impl, []).append(seconds)


def hold_ceilings(executor: Executor, before, dtypes, store: ResultsStore, book: RoundBook,
                  probe: bool = False) -> dict:
    """The ceilings measured again after the sweep (the run's last moment: in full, or with `probe` and no warm row
    to judge at a cache level, probed as each round is), and every row this invocation measured judged again at the
    moments around its rounds (bench.spec.roof_verdict.judged_at_moments); returns what run.json keeps of it."""
    started = time.time()
    rows = store.frame()
    judged = rows[rows["mode"] == "compiled"] if "mode" in rows else rows  # an interpreter's rows have no roof to hold
    levels = judged.get("roof_level", pd.Series(dtype=str)).isin(["l2", "llc"]).any()
    if probe and not levels:
        found = _probed_after(executor, before, book)
    else:
        again = before if levels else dataclasses.replace(before, levels={})  # no warm row: no level to measure again
        try:
            after, why = executor.ceilings(dtypes, before=again)
        except Exception as err:  # a worker that died measuring them: the rows keep the moments measured before
            after, why = None, f"not measured again: {one_line(err)}"
        found = record(before, after, why)
        if after is not None:
            book.moments.append(moment(after, "after", (started + time.time()) / 2))
    load = SimpleNamespace(warnings=[w for m in book.moments for w in m.get("warnings", ()) if "under load" in w])
    found["rows_judged_again"] = store.rewrite_rows(
        lambda r: with_ceiling_load(book.judged(row_key(r), r), load) if row_key(r) in book else r)
    found["ceiling_moments"] = [{k: v for k, v in m.items() if k != "warnings"} for m in book.moments]
    found["ceiling_spread"] = {k: round(v, 4) for k, v in spread(book.moments).items()}
    warning = drift_warning(book.moments)
    found["ceiling_warnings"] = [w for m in book.moments[1:] for w in m.get("warnings", ())] + (
        [warning] if warning else [])
    found["drift_flag"] = DRIFT_FLAG
    return found


def _probed_after(executor: Executor, before, book: RoundBook) -> dict:
    """The last moment of a run in rounds, probed as each round's start was (the streams by the kernels that won
    before, the matmuls at their sizes): what run.json keeps of it."""
    try:
        probed = executor.probe(before, "after")
    except Exception as err:  # a worker that died probing: the rows keep the moments measured before
        return {"ceilings_after": None, "ceilings_after_note": f"not measured again: {one_line(err)}",
                "ceiling_drift": {}}
    if probed is None:
        return {"ceilings_after": None, "ceiling_drift": {},
                "ceilings_after_note": "not measured again: the host's kept ceilings judge every run"}
    book.moments.append(probed)
    first = book.moments[0]
    figures = [f"{s}_gbps" for s in ("read", "write", "copy")]
    moved = {k: probed[k] / first[k] - 1 for k in figures if first.get(k)}
    moved.update({f"matmul {d}": tf / first["peak_tflops"][d] - 1 for d, tf in probed["peak_tflops"].items()
                  if first["peak_tflops"].get(d)})
    return {"ceilings_after": None, "ceiling_drift": {k: round(v, 4) for k, v in moved.items()},
            "ceilings_after_note": "probed after the run, as each round's start was (ceiling_moments)"}


def judged_warm(plan, timer: TimerConfig) -> bool:
    """Whether a compiled row of the plan will be timed warm, so judged at a cache level's ceilings (--warm, or an
    operator that streams nothing: the elementwise ops); an interpreter's rows are judged at none."""
    compiled = [case for case, impls in plan if any(impl_mode(i) == "compiled" for i in impls)]
    return bool(compiled) and (not timer.cold or any(not operator_of(case).streamed for case in compiled))


def _snapshot(device: torch.device) -> dict:
    from ..instruments.contention import snapshot

    return snapshot(device)  # /proc and nvidia-smi only: the parent of a worker never touches the device


def check_rounds(cfg: RunConfig) -> None:
    """Repeated rounds append every row again: nothing to resume or to replace by key."""
    if cfg.rounds < 1:
        raise ValueError(f"rounds: at least 1, got {cfg.rounds}")
    if cfg.rounds > 1 and not cfg.combine_rounds and (cfg.resume or cfg.retry_noisy):
        raise ValueError("rounds: appended rounds neither resume nor retry noisy rows (each round is a repeat)")


def run(cfg: RunConfig):
    """Measure every (case, impl) not already in cfg.out_dir, in cfg.rounds rounds; returns all rows there as a
    DataFrame. A Ctrl-C keeps every row written and closes run.json as interrupted."""
    check_rounds(cfg)
    device = cfg.device
    timer = cfg.timer or default_timer(device)
    options = measurement_options(device, timer, cfg.profiled)
    sweep = sweep_of(cfg)
    store = ResultsStore(cfg.out_dir, resume=cfg.resume, retry_failed=cfg.retry_failed, options=options, sweep=sweep)
    try:
        return _sweep(cfg, store, timer, options, sweep)
    finally:
        store.close()


def _sweep(cfg: RunConfig, store: ResultsStore, timer: TimerConfig, options: dict, sweep: dict):
    """run() with the folder held: the ceilings, then every row, then results.parquet and run.json (those also
    when the sweep stops: on a full disk or a read-only folder the rows written before stay, and run.json says why,
    where it can still be written)."""
    device = cfg.device
    cases = list(cfg.cases)
    if cfg.time_budget_s is not None:
        cases = [cases[i] for i in spread_order(len(cases))]
    plan = [(case, impls_for(case, cfg.impls)) for case in cases]
    # a matmul ceiling per dtype the kernels multiply in (torch's host weight-only kernels: fp32 on bf16 inputs)
    dtypes = ceiling_dtypes([(c, i) for c, impls in plan for i in impls], device.type) or sorted(
        {c.dtype for c in cases})
    state_before = _snapshot(device)
    executor = Executor(device, timer, detect_contention=cfg.detect_contention, isolation=cfg.isolation)
    meta: dict = {}
    with executor:
        started = time.time()
        ceil = executor.ceilings(dtypes, refresh=cfg.refresh_ceilings, levels=judged_warm(plan, timer))
        book = RoundBook([moment(ceil, "before", (started + time.time()) / 2)])
        previous = store.previous_run() if cfg.resume else None
        run_id = previous["run_id"] if previous and "run_id" in previous else new_run_id()
        meta = {"run_id": run_id, "started": (previous or {}).get("started", now()), "finished": None,
                "interrupted": False, "suite": cfg.suite, "profiled": cfg.profiled, "measurement": options,
                "sampling": sampling_rule(timer), **executor.metadata(), "cold_operands": cold_policy(device, timer),
                "selection": _joined(sweep, previous), "isolation": executor.describe(),
                "ceilings": ceil.to_json(), "rounds": cfg.rounds, "rounds_rule": rounds_rule(cfg),
                "state_before": state_before, "state_after": None}
        store.write_run(meta)
        label = HarnessSampler(timer, device.type).label
        budget = TimeBudget(cfg.time_budget_s, timer, cfg.started) if cfg.time_budget_s is not None else None

        def measure_one(case, impl: str, base: dict) -> dict:
            """The row of (case, impl) from its base row: measured, or skipped when the time budget says so; `_at`
            (not a column) the middle of its measurement in epoch seconds."""
            refusal = budget.refusal(impl) if budget is not None else None
            started = time.time()
            if refusal:  # `refused`: the store keeps a failed row that this was to retry (never written to a file)
                row = {**base, "status": "skipped", "reason": refusal, "refused": True}
            else:
                row = executor.measure(case, impl, dict(base))
                if budget is not None:
                    budget.record(impl, time.time() - started)
            return {**row, "time": now(), "profiled": cfg.profiled, "_at": (started + time.time()) / 2}

        sweep_rounds = SweepRounds(cfg, executor, store, book, measure_one,
                                   lambda case, impl: base_row(case, impl, run_id, cfg.suite, ceil, label), ceil)
        failing = False
        try:
            executor.capture(cfg.capture)  # a profiler records the cases only, not the ceilings or the setup
            fresh = sweep_rounds.combined(plan, run_id) if cfg.combine_rounds else sweep_rounds.appended(plan)
            meta["noisy_retries"] = sweep_rounds.retry_noisy(cfg.retry_noisy)
            meta["rounds_run"] = sweep_rounds.rounds_run
            if sweep_rounds.probe_failures:
                meta["probe_failures"] = sweep_rounds.probe_failures
            if fresh and cfg.capture is None:  # a profiler would record the second measurement
                meta.update(hold_ceilings(executor, ceil, dtypes, store, book, probe=cfg.combine_rounds))
            else:
                meta["ceilings_after_note"] = ("not measured again: " + ("a profiled run" if fresh else
                                                                          "no row measured by this invocation"))
        except KeyboardInterrupt:
            meta["interrupted"] = failing = True
            raise
        except WriteError as err:
            meta["interrupted"], meta["write_error"], failing = True, str(err), True
            raise
        except BaseException:
            failing = True
            raise
        finally:
            df, unwritten = store.write_parquet(quiet=True), store.unwritten  # the CSV holds the rows either way
            meta["finished"] = now()
            meta["state_after"] = _snapshot(device)
            if not meta["interrupted"]:  # the config each tuned Triton kernel chose, per tuning key
                meta["autotune"] = executor.autotune()
                if cfg.combine_rounds and sweep_rounds.autotune_rounds:  # each round's process tuned its own
                    meta["autotune_rounds"] = [*sweep_rounds.autotune_rounds, meta["autotune"]]
            meta["isolation"] = executor.describe()
            if unwritten is not None and not failing:
                meta["write_error"] = str(unwritten)
            store.write_run(meta, quiet=failing)
    if unwritten is not None:  # every row written, results.parquet not: the run ends on it
        raise unwritten
    return df
