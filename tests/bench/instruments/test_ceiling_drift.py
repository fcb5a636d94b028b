"""Ceilings at the moments of a run: measured again after it and probed at each round (fake measurements), each
measurement one moment, and what moved over the run named."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from phasebench.bench.instruments import ceiling_drift, roofline

CPU = torch.device("cpu")
LEVELS = {"l2": {"bytes": 2 << 20, "read_gbps": 151.0, "write_gbps": 97.0, "copy_gbps": 183.0},
          "llc": {"bytes": 32 << 20, "read_gbps": 118.0, "write_gbps": 61.0, "copy_gbps": 104.0}}


def before() -> roofline.Ceilings:
    return roofline.Ceilings(device="host", kind="cpu", peak_gbps=22.1, read_gbps=30.2, write_gbps=14.9,
                             peak_tflops={"float32": 0.263, "bfloat16": 0.039}, matmul_n={"float32": 1024,
                             "bfloat16": 512}, levels=LEVELS, warnings=["far from the datasheet"])


def after_with(**scales) -> roofline.Ceilings:
    b = before()
    levels = {k: {**v, "read_gbps": v["read_gbps"] * scales.get("levels", 1.0)} for k, v in LEVELS.items()}
    return replace(b, read_gbps=b.read_gbps * scales.get("read", 1.0), write_gbps=b.write_gbps * 0.97,
                   peak_tflops={"float32": 0.263 * scales.get("matmul", 1.0), "bfloat16": 0.039}, levels=levels,
                   warnings=[])


def test_each_measurement_is_one_moment_and_the_spread_names_what_moved():
    """The sample's read ceiling read 30.2 GB/s in one measurement and 27.5 in the next: each measurement is kept as a
    moment of its own (no figure of one mixed into another), and what moved past 5% over the run is named."""
    after = after_with(read=27.5 / 30.2, matmul=1.21, levels=1.02)
    first, last = ceiling_drift.moment(before(), "before", 100.0), ceiling_drift.moment(after, "after", 160.0)
    assert (first["read_gbps"], first["at"], last["read_gbps"]) == (30.2, 100.0, pytest.approx(27.5))
    assert last["levels"]["l2"]["read_gbps"] == pytest.approx(151.0 * 1.02) and "bytes" not in last["levels"]["l2"]
    assert first["warnings"] == ["far from the datasheet"]
    moved = ceiling_drift.spread([first, last])
    assert moved["read_gbps"] == pytest.approx(30.2 / 27.5 - 1) and moved["matmul float32"] == pytest.approx(0.21)
    warning = ceiling_drift.drift_warning([first, last])
    assert warning.startswith("ceilings moved during the run (highest over lowest of 2 measurements: matmul float32 "
                              "21%, read_gbps 10%")
    assert "write_gbps" not in warning  # 3%: no drift
    assert ceiling_drift.drift_warning([first]) is None and ceiling_drift.spread([first]) == {}
    moved = ceiling_drift.drift(before(), after)
    assert moved["read_gbps"] == pytest.approx(27.5 / 30.2 - 1)


def test_a_rounds_probe_times_each_stream_by_its_fastest_kernel_before_and_each_matmul_at_its_size(monkeypatch):
    calls = []

    def stream(device, s, cfg, buffers, kernels):
        calls.append((s, kernels))
        return {"gbps": {"read": 29.0, "write": 14.0, "copy": 20.0}[s]}

    monkeypatch.setattr(ceiling_drift, "StreamBuffers", lambda device: object())
    monkeypatch.setattr(ceiling_drift, "measure_stream", stream)
    monkeypatch.setattr(ceiling_drift, "measure_matmul", lambda device, d, cfg, n: calls.append((d, n)) or 0.25)
    ceil = replace(before(), bandwidth={"read": {"kernel": "gemv"}, "write": {"kernel": "fill"}})
    found = ceiling_drift.probe_moment(CPU, ceil, "round 2")
    assert calls == [("read", ("gemv",)), ("write", ("fill",)), ("copy", ("copy",)), ("float32", 1024),
                     ("bfloat16", 512)]
    assert (found["name"], found["read_gbps"], found["copy_gbps"], found["levels"]) == ("round 2", 29.0, 20.0, {})
    assert found["peak_tflops"] == {"float32": 0.25, "bfloat16": 0.25} and found["at"] > 0


def test_kept_host_ceilings_are_not_measured_again(monkeypatch, tmp_path):
    monkeypatch.setenv(roofline.HOST_KEEP_ENV, str(tmp_path))
    after, why = ceiling_drift.measure_again(CPU, before())
    assert after is None and "kept in" in why
    record = ceiling_drift.record(before(), None, why)
    assert record["ceilings_after"] is None and record["ceiling_drift"] == {}


def test_after_the_run_the_same_ceilings_are_measured_again_at_the_same_sizes(monkeypatch):
    monkeypatch.delenv(roofline.HOST_KEEP_ENV, raising=False)
    calls = []
    monkeypatch.setattr(ceiling_drift, "measure_streams", lambda device, cfg: calls.append("streams") or {
        "read": {"gbps": 31.0}, "write": {"gbps": 15.5}, "copy": {"gbps": 21.0}})
    monkeypatch.setattr(ceiling_drift, "measure_levels", lambda device, cfg: calls.append("levels") or LEVELS)
    monkeypatch.setattr(ceiling_drift, "measure_matmul", lambda device, dtype, cfg, n: calls.append((dtype, n)) or 0.3)
    after, why = ceiling_drift.measure_again(CPU, before())
    assert calls == ["streams", "levels", ("float32", 1024), ("bfloat16", 512)] and why == after.checked
    assert (after.read_gbps, after.write_gbps, after.copy_gbps) == (31.0, 15.5, 21.0)
    assert after.peak_tflops == {"float32": 0.3, "bfloat16": 0.3} and after.measured_at and after.levels == LEVELS
    record = ceiling_drift.record(before(), after, why)
    assert record["ceilings_after"]["read_gbps"] == 31.0 and record["ceiling_drift"]["read_gbps"] == pytest.approx(
        31.0 / 30.2 - 1, abs=1e-4)
