"""The (case, impl) grid and shared state of the pytest-benchmark suite, from its command-line options."""

from __future__ import annotations

import functools
import os

import torch

from .roofline import Ceilings, ceilings
from .selection import UsageError, build_cases, resolve_device, resolve_impls


class _Options:
    """The subset of `phasebench run`'s arguments that the benchmark suite takes."""

    def __init__(self, config):
        self.suite = config.getoption("--suite")
        env_impls = [i for i in os.environ.get("PHASEBENCH_IMPL", "").split(",") if i]
        self.impl = config.getoption("--impl") or env_impls or None
        self.device = config.getoption("--device")
        self.dtype = config.getoption("--dtype")
        self.model = None
        self.shape = None


def bench_params(config) -> tuple[list, list[str]]:
    opts = _Options(config)
    try:
        device = resolve_device(opts.device)
        cases, _ = build_cases(opts, device)
        impls = resolve_impls(opts.impl, device)
    except UsageError as err:
        raise ValueError(str(err)) from None
    config.phasebench_device = device
    config.phasebench_suite = opts.suite
    return cases, impls


@functools.cache
def suite_ceilings(device: torch.device, dtypes: tuple[str, ...]) -> Ceilings:
    return ceilings(device, dtypes)

