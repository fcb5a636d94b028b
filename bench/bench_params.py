"""The (case, impl) grid, plugins and timer of the pytest-benchmark suite, from its command-line options."""

from __future__ import annotations

import functools
import os
import time

import torch

from ..profiles.nvtx_ranges import nvtx_range
from .instruments.cuda_events import flush_l2, l2_flush_buffer
from .instruments.roofline import Ceilings, ceilings
from .instruments.timing import CI_TARGETS, TimerConfig, Timing, checked_call
from .sweep.executor import Executor
from .sweep.measure import base_row, sync
from .sweep.selection import Selection, UsageError, build_cases, case_ops, load_plugins, resolve_device, resolve_impls
from .sweep.worker import Isolation

# the worker's first calls of a (case, impl): the gate and two timed calls (their output is checked too)
PREFLIGHT_TIMER = TimerConfig(warmup_s=0.0, budget_s=0.0, min_samples=2, max_samples=2, flush_l2=False, cold=False)

BUDGET_S = 0.5
MIN_ROUNDS = 6  # the fewest samples whose extremes hold the median with 95%


def _env_list(name: str) -> list[str]:
    return [i for i in os.environ.get(name, "").split(",") if i]


def _selection(config) -> Selection:
    """The subset of `phasebench run`'s case selection that the benchmark suite takes (options, else env)."""
    return Selection(suite=config.getoption("--suite"), op=config.getoption("--op") or _env_list("PHASEBENCH_OP"),
                     impl=config.getoption("--impl") or _env_list("PHASEBENCH_IMPL"),
                     plugin=config.getoption("--plugin") or _env_list("PHASEBENCH_PLUGIN"),
                     device=config.getoption("--device"), dtype=config.getoption("--dtype"))


def _isolation(config, plugins: tuple[str, ...]) -> Isolation:
    """--no-isolate and --case-timeout as `phasebench run` takes them: the preflight worker, or none."""
    timeout = config.getoption("--case-timeout")
    return Isolation(not config.getoption("--no-isolate"), plugins, None if timeout in (None, "") else float(timeout))


def bench_params(config) -> tuple[list, list[str]]:
    selection, shard = _selection(config), config.getoption("--shard")
    try:
        load_plugins(selection.plugin)
        device = resolve_device(selection.device)
        cases, suite = build_cases(selection, device)
        impls = resolve_impls(selection.impl, device, case_ops(cases), compiled=suite != "quick")
        if shard:
            from .sweep.spread.shards import parse_shard, shard_cases

            cases = shard_cases(cases, *parse_shard(shard), impls)
    except UsageError as err:
        raise ValueError(str(err)) from None
    config.phasebench_device = device
    config.phasebench_suite = selection.suite
    config.phasebench_cold = not config.getoption("--warm")
    config.phasebench_isolation = _isolation(config, selection.plugin)
    return cases, impls


@functools.cache
def suite_ceilings(device: torch.device, dtypes: tuple[str, ...]) -> Ceilings:
    return ceilings(device, dtypes)


@functools.cache
def flush_buffer(device: torch.device) -> torch.Tensor:
    """One L2 flush buffer per device for the whole session (each test would otherwise allocate its own)."""
    return l2_flush_buffer(device)


def preflight(config, device: torch.device, pairs, ceil_of) -> dict:
    """Each (case, impl) gated and called in a worker process before pytest calls it ({} with --no-isolate): a
    kernel that crashes, hangs or loses the CUDA context there costs its own test, never pytest's process. The
    worker is gone before anything is timed here, so it never shares the device with a timed call."""
    isolation = config.phasebench_isolation
    if not isolation.isolate:
        return {}
    rows = {}
    with Executor(device, PREFLIGHT_TIMER, detect_contention=False, isolation=isolation) as worker:
        for case, impl in pairs:
            row = base_row(case, impl, "pytest-benchmark", config.phasebench_suite, ceil_of(case, impl), "preflight")
            rows[case, impl] = worker.measure(case, impl, row)
    return rows


class BenchmarkSampler:
    """The measuring path's timer under pytest-benchmark: `pedantic` rounds of a call that completes on the device;
    on the host, the calls on copies of the streamed operands taken in turn (or an eviction first), as the runner
    does, unless `cold` is off (`--warm`)."""

    def __init__(self, benchmark, device: torch.device, cold: bool = True):
        self.benchmark = benchmark
        self.flush = flush_buffer(device) if device.type == "cuda" else None
        self.cold = cold and device.type == "cpu"
        self.flush_l2 = self.flush is not None
        self.label = "pytest-benchmark+cold" if self.cold else "pytest-benchmark"

    def __call__(self, calls, device, *, range_name, payload, interpreter, evict=None, before_last=None,
                 guard_last=None) -> Timing:
        calls, kept = list(calls), {"next": 0}

        def timed(fn):  # the host clock stops only once the device has finished
            fn()
            sync(device)

        def setup():  # outside the clock: the next call in turn, the L2 flush or the host eviction before it
            if self.flush is not None:
                flush_l2(self.flush)
                torch.cuda.synchronize(device)
            if evict is not None:
                evict()
            fn = calls[kept["next"] % len(calls)]
            kept["next"] += 1
            return (fn,), {}
        from .sweep.measure import INTERPRETER_SAMPLES

        rounds, warmup = INTERPRETER_SAMPLES, 0  # an interpreter row: one call after the gate's
        if not interpreter:  # as many rounds as fit the budget, from one warm call; 6 at least, for an interval
            t0 = time.perf_counter()
            timed(*setup()[0])
            rounds, warmup = max(MIN_ROUNDS, min(500, int(BUDGET_S / max(time.perf_counter() - t0, 1e-6)))), 1
        with nvtx_range(range_name, payload=payload):
            self.benchmark.pedantic(timed, setup=setup, rounds=rounds, warmup_rounds=warmup, iterations=1)
        data = self.benchmark.stats.stats.data
        target = 0.0 if interpreter else CI_TARGETS[device.type]  # fixed rounds: converged says whether they sufficed
        # the checked call after the rounds, the next in turn, untimed (its output is judged)
        last = checked_call(calls[kept["next"] % len(calls)], lambda: sync(device), before_last, guard_last)
        return Timing(tuple(s * 1e3 for s in data), self.label, last, target)
