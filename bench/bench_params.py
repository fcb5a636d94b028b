"""The (case, impl) grid, plugins and timer of the pytest-benchmark suite, from its command-line options."""

from __future__ import annotations

import functools
import os
import time

import torch

from ..profiles.nvtx_ranges import nvtx_range
from .instruments.roofline import Ceilings, ceilings
from .instruments.timing import Timing, l2_flush_buffer
from .sweep.measure import sync
from .sweep.selection import UsageError, build_cases, case_ops, load_plugins, resolve_device, resolve_impls

BUDGET_S = 0.5


def _env_list(name: str) -> list[str]:
    return [i for i in os.environ.get(name, "").split(",") if i]


class _Options:
    """The subset of `phasebench run`'s arguments that the benchmark suite takes."""

    def __init__(self, config):
        self.suite = config.getoption("--suite")
        self.impl = config.getoption("--impl") or _env_list("PHASEBENCH_IMPL") or None
        self.plugin = config.getoption("--plugin") or _env_list("PHASEBENCH_PLUGIN")
        self.device = config.getoption("--device")
        self.dtype = config.getoption("--dtype")
        self.model = None
        self.shape = None
        self.op = config.getoption("--op") or _env_list("PHASEBENCH_OP") or None
        self.shard = config.getoption("--shard")
        self.warm = config.getoption("--warm")


def bench_params(config) -> tuple[list, list[str]]:
    opts = _Options(config)
    try:
        load_plugins(opts.plugin)
        device = resolve_device(opts.device)
        cases, _ = build_cases(opts, device)
        impls = resolve_impls(opts.impl, device, case_ops(cases))
        if opts.shard:
            from .sweep.shards import parse_shard, shard_cases

            cases = shard_cases(cases, *parse_shard(opts.shard), impls)
    except UsageError as err:
        raise ValueError(str(err)) from None
    config.phasebench_device = device
    config.phasebench_suite = opts.suite
    config.phasebench_cold = not opts.warm
    return cases, impls


@functools.cache
def suite_ceilings(device: torch.device, dtypes: tuple[str, ...]) -> Ceilings:
    return ceilings(device, dtypes)


@functools.cache
def flush_buffer(device: torch.device) -> torch.Tensor:
    """One L2 flush buffer per device for the whole session (each test would otherwise allocate its own)."""
    return l2_flush_buffer(device)


class BenchmarkSampler:
    """The measuring path's timer under pytest-benchmark: `pedantic` rounds of a call that completes on the device;
    on the host, the calls on copies of the streamed operands taken in turn (or an eviction first), as the runner
    does, unless `cold` is off (`--warm`)."""

    def __init__(self, benchmark, device: torch.device, cold: bool = True):
        self.benchmark = benchmark
        self.flush = flush_buffer(device) if device.type == "cuda" else None
        self.cold = cold and device.type == "cpu"
        self.label = "pytest-benchmark+cold" if self.cold else "pytest-benchmark"

    def __call__(self, calls, device, *, range_name, payload, interpreter, evict=None) -> Timing:
        calls, kept = list(calls), {"next": 0, "last": None}

        def timed(fn):  # the host clock stops only once the device has finished
            kept["last"] = fn()
            sync(device)

        def setup():  # outside the clock: the next call in turn, the L2 flush or the host eviction before it
            if self.flush is not None:
                self.flush.zero_()
                torch.cuda.synchronize(device)
            if evict is not None:
                evict()
            fn = calls[kept["next"] % len(calls)]
            kept["next"] += 1
            return (fn,), {}
        from .sweep.measure import INTERPRETER_SAMPLES

        rounds = INTERPRETER_SAMPLES
        if not interpreter:  # as many rounds as fit the budget, from one warm call
            t0 = time.perf_counter()
            timed(*setup()[0])
            rounds = max(5, min(500, int(BUDGET_S / max(time.perf_counter() - t0, 1e-6))))
        with nvtx_range(range_name, payload=payload):
            self.benchmark.pedantic(timed, setup=setup, rounds=rounds, warmup_rounds=1, iterations=1)
        data = self.benchmark.stats.stats.data
        return Timing(tuple(s * 1e3 for s in data), self.label, kept["last"])
