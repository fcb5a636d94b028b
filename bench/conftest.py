"""Options of the pytest-benchmark suite: `pytest bench [--suite S] [--op O] [--impl I] [--device D]`, and its grid."""

from __future__ import annotations

import os

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("phasebench")
    group.addoption("--suite", default=os.environ.get("PHASEBENCH_SUITE", "quick"),
                    help="phasebench suite to benchmark (default quick; env PHASEBENCH_SUITE)")
    group.addoption("--impl", action="append", default=None,
                    help="implementation to benchmark, repeatable (default: all available; env PHASEBENCH_IMPL=a,b)")
    group.addoption("--plugin", action="append", default=None,
                    help="module (or .py file) that registers implementations, repeatable (env PHASEBENCH_PLUGIN=a,b)")
    group.addoption("--op", action="append", default=None,
                    help="only cases of this operator, repeatable: attention, linear (env PHASEBENCH_OP=a,b)")
    group.addoption("--device", default=os.environ.get("PHASEBENCH_DEVICE"),
                    help="cpu, cuda or cuda:N (default: the best device here; env PHASEBENCH_DEVICE)")
    group.addoption("--dtype", default=os.environ.get("PHASEBENCH_DTYPE"),
                    help="float32, float16 or bfloat16 (default: bfloat16 on CUDA, float32 on CPU)")
    group.addoption("--shard", default=os.environ.get("PHASEBENCH_SHARD"), metavar="K/N",
                    help="only shard K of N (1-based) of the cases, every impl of a case in one shard, as "
                         "`phasebench run --shard`; env PHASEBENCH_SHARD (pytest-benchmark is off under xdist)")
    group.addoption("--warm", action="store_true", default=bool(os.environ.get("PHASEBENCH_WARM")),
                    help="host: time with warm caches (default: the weights and the KV cache cold, as a forward "
                         "pass streams them; env PHASEBENCH_WARM=1)")
    group.addoption("--no-isolate", action="store_true", default=bool(os.environ.get("PHASEBENCH_NO_ISOLATE")),
                    help="call the kernels in this process only (default: each (case, impl) is first gated and "
                         "called in a worker process, so a kernel that crashes or hangs fails its test instead of "
                         "pytest; env PHASEBENCH_NO_ISOLATE=1)")
    group.addoption("--expectations", action="store_true", default=bool(os.environ.get("PHASEBENCH_EXPECTATIONS")),
                    help="also measure the timing expectations the unit tests do not assert (a large prefill stretches "
                         "a co-located decode, a protection saves it, the L2 flush evicts, compare finds a slowed "
                         "kernel): each figure with its expectation in extra_info and the terminal summary "
                         "(env PHASEBENCH_EXPECTATIONS=1)")
    group.addoption("--case-timeout", type=float, default=os.environ.get("PHASEBENCH_CASE_TIMEOUT"), metavar="S",
                    help="seconds the worker's first calls of a (case, impl) may take (default as `phasebench run`; "
                         "0: no limit; env PHASEBENCH_CASE_TIMEOUT)")


def pytest_generate_tests(metafunc):
    if not {"case", "impl"} <= set(metafunc.fixturenames):
        return
    from phasebench.bench.bench_params import bench_params
    from phasebench.bench.sweep.runner import impls_for

    cases, impls = bench_params(metafunc.config)
    pairs = [(case, impl) for case in cases for impl in impls_for(case, impls)]
    ids = [f"{c.op}-{c.shape_label.replace(' ', '-')}-{c.phase}-{impl}" for c, impl in pairs]
    metafunc.parametrize("case,impl", pairs, ids=ids)


EXPECTATIONS = pytest.StashKey[list]()


@pytest.fixture
def expect(benchmark, request):
    """expect(figure, value, rule, met, **context) records one timing expectation of the test: in its
    `benchmark.extra_info["expectations"]` (the JSON) and in the session's summary. `met` is None where the figure
    cannot be judged here; `context` says why, or under what conditions it was measured."""
    lines = request.config.stash.setdefault(EXPECTATIONS, [])

    def record(figure: str, value: float, rule: str, met: bool | None, **context) -> None:
        benchmark.extra_info.setdefault("expectations", []).append(
            {"figure": figure, "value": value, "expected": rule, "met": met, **context})
        verdict = {True: "met", False: "NOT MET"}.get(met, "not judged")
        notes = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in context.items())
        lines.append(f"{request.node.name}: {figure} = {value:.3g}, expected {rule}: {verdict}"
                     + (f" ({notes})" if notes else ""))

    return record


def pytest_terminal_summary(terminalreporter, config):
    """The timing expectations measured in this session, one line each."""
    lines = config.stash.get(EXPECTATIONS, [])
    if lines:
        terminalreporter.section("phasebench timing expectations")
        for line in lines:
            terminalreporter.write_line(line)
