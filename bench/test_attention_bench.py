"""pytest-benchmark suite: each (case, impl) checked against the reference, then timed with a synchronised call."""

from __future__ import annotations

import time

import pytest
import torch
from phasebench.bench.bench_params import suite_ceilings
from phasebench.bench.correctness import TOLERANCE, relative_error
from phasebench.bench.memory import does_not_fit
from phasebench.bench.runner import INTERPRETER_SAMPLES, CaseState, base_row, speed_figures, sync
from phasebench.bench.timing import l2_flush_buffer
from phasebench.kernels import Unsupported, prepare

EXTRA_FIELDS = ("impl", "backend", "mode", "phase", "batch", "q_heads", "kv_heads", "q_len", "kv_len", "head_dim",
                "causal", "dtype", "model", "suite", "device", "device_kind", "flops", "bytes", "intensity", "tflops",
                "gbps", "peak_tflops", "peak_gbps", "roof_tflops", "pct_roofline", "bound", "max_rel_err", "timer")
BUDGET_S = 0.5
_states: dict = {}


def case_state(case, device) -> CaseState:
    """Inputs and reference shared by the impls of one case (the grid runs impls of a case together)."""
    if case not in _states:
        _states.clear()
        _states[case] = CaseState(case, device)
    return _states[case]


@pytest.fixture(scope="session")
def device(pytestconfig):
    return pytestconfig.phasebench_device


def test_attention(benchmark, case, impl, device, pytestconfig):
    ceil = suite_ceilings(device, (case.dtype,))
    row = base_row(case, impl, "pytest-benchmark", pytestconfig.phasebench_suite, ceil)
    reason = does_not_fit(case, impl, device)
    if reason:
        pytest.skip(reason)
    state = case_state(case, device)
    x = state.inputs
    try:
        call = prepare(x.q, x.k, x.v, impl=impl, causal=case.causal)
    except Unsupported as err:
        pytest.skip(f"unsupported: {err}")
    row["backend"] = call.backend
    out = call.run()
    sync(device)
    row["max_rel_err"] = relative_error(out, state.reference)
    del out
    err = row["max_rel_err"]
    assert err <= TOLERANCE[case.dtype], f"{impl} is incorrect: max relative error {err:.3g}"

    def timed():  # the clock stops only once the device has finished
        call.run()
        sync(device)

    setup = None
    if device.type == "cuda":  # the flush runs and completes before the clock starts
        buffer = l2_flush_buffer(device)

        def setup():
            buffer.zero_()
            torch.cuda.synchronize(device)
    rounds = INTERPRETER_SAMPLES
    if row["mode"] != "interpreter":  # as many rounds as fit the budget, from one warm call
        t0 = time.perf_counter()
        timed()
        rounds = max(5, min(500, int(BUDGET_S / max(time.perf_counter() - t0, 1e-6))))
    benchmark.pedantic(timed, setup=setup, rounds=rounds, warmup_rounds=1, iterations=1)
    info = dict(row, timer="pytest-benchmark host clock, synchronised call")
    stats = getattr(benchmark, "stats", None)
    if stats is not None:
        info.update(speed_figures(row, stats.stats.median * 1e3))
    benchmark.extra_info.update({k: info[k] for k in EXTRA_FIELDS})
