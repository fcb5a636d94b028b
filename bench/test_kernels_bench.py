"""pytest-benchmark suite: each (case, impl) of any operator goes through the runner's measuring path,
timed by pytest-benchmark."""

from __future__ import annotations

import pytest
import torch
from phasebench.bench.bench_params import BenchmarkSampler, preflight, suite_ceilings
from phasebench.bench.instruments.contention import ContentionProbe
from phasebench.bench.instruments.roofline import on_device
from phasebench.bench.spec.interval import INTERVAL_COLUMNS
from phasebench.bench.sweep.measure import CaseState, base_row, ceiling_dtypes, measure

EXTRA_FIELDS = ("op", "impl", "backend", "mode", "phase", "shape", "dtype", "model", "suite", "device", "device_kind",
                "flops", "bytes", "intensity", "read_bytes", "write_bytes", "tflops", "gbps", "peak_tflops",
                "compute_dtype", "peak_gbps", "read_gbps", "write_gbps", "roof_tflops", "pct_roofline", "bound",
                "roof_model", "above_roof", "cache_state", "roof_level", "level_read_gbps", "level_write_gbps",
                "level_copy_gbps", "level_note", "max_rel_err", "timer", "noisy", "noise_reason", "status", "reason",
                *INTERVAL_COLUMNS)
_states: dict = {}


def case_state(case, device) -> CaseState:
    """Inputs and reference shared by the impls of one case (the grid runs impls of a case together)."""
    if case not in _states:
        _states.clear()  # the previous case is freed before the next one's fit check
        if device.type == "cuda":
            torch.cuda.empty_cache()
        _states[case] = CaseState(case, device)
    return _states[case]


@pytest.fixture(scope="session")
def device(pytestconfig):
    return pytestconfig.phasebench_device


@pytest.fixture(scope="session")
def probe(device):
    return ContentionProbe(device)


def _ceilings(device):
    """(case, impl) -> the ceilings that hold the matmul ceiling of what the impl multiplies in on the case."""
    return lambda case, impl: suite_ceilings(device, ceiling_dtypes([(case, impl)], device.type))


@pytest.fixture(scope="session")
def first_calls(device, request):
    """The worker's verdict on every selected (case, impl), before any is called here."""
    pairs = [(item.callspec.params["case"], item.callspec.params["impl"]) for item in request.session.items
             if getattr(item, "originalname", None) == "test_kernel"]
    return preflight(request.config, device, pairs, _ceilings(device))


def test_kernel(benchmark, case, impl, device, probe, first_calls, pytestconfig):
    ceil = _ceilings(device)(case, impl)
    sampler = BenchmarkSampler(benchmark, device, cold=pytestconfig.phasebench_cold)
    row = base_row(case, impl, "pytest-benchmark", pytestconfig.phasebench_suite, ceil, sampler.label)
    first = first_calls.get((case, impl), {"status": "ok"})
    if first["status"] != "ok":  # failed, incorrect or skipped in the worker: never called in this process
        row = first
    else:
        with on_device(device):  # Triton launches and events act on the current device
            row = measure(case_state(case, device), impl, row, sampler, probe)
    if row["status"] == "skipped":
        pytest.skip(row["reason"])
    assert row["status"] == "ok", f"{impl} {row['status']}: {row['reason']}"
    case_fields = [k for k in case.row_fields() if k not in EXTRA_FIELDS]
    benchmark.extra_info.update({k: row[k] for k in (*EXTRA_FIELDS, *case_fields)})
