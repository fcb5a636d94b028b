"""Ceilings that hold for a run: measured again after it (fake measurements), the higher of each figure kept, the drift
named, and the map a stored row's ceilings are judged again through."""

from __future__ import annotations

import math
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


def test_the_higher_of_each_figure_is_kept_and_a_drift_is_named():
    """The sample's read ceiling read 30.2 GB/s in one run and 27.5 in the next: after the run it may read higher or
    lower, figure by figure; each row is judged against the higher, and what moved past 5% is named."""
    after = after_with(read=27.5 / 30.2, matmul=1.21, levels=1.02)
    used = ceiling_drift.higher(before(), after)
    assert (used.read_gbps, used.write_gbps, used.peak_gbps) == (30.2, 14.9, 22.1)  # the before figures were higher
    assert used.peak_tflops == {"float32": pytest.approx(0.263 * 1.21), "bfloat16": 0.039}
    assert used.levels["l2"]["read_gbps"] == pytest.approx(151.0 * 1.02) and used.levels["l2"]["write_gbps"] == 97.0
    moved = ceiling_drift.drift(before(), after)
    assert moved["read_gbps"] == pytest.approx(27.5 / 30.2 - 1) and moved["matmul float32"] == pytest.approx(0.21)
    warning = used.warnings[-1]
    assert warning.startswith("ceilings drifted during the run (matmul float32 +21%, read_gbps -9%")
    assert "l2 read_gbps" not in warning and "far from the datasheet" in used.warnings  # 2% is no drift
    assert ceiling_drift.higher(before(), None) == before()


def test_a_rows_ceilings_are_found_by_value_with_their_drift():
    after = after_with(read=1.1, levels=1.25)
    used = ceiling_drift.higher(before(), after)
    subs = ceiling_drift.substitutions(before(), used, after)
    values = subs["values"]
    assert values[30.2] == (pytest.approx(33.22), pytest.approx(0.1)) and values[14.9] == (14.9, pytest.approx(-0.03))
    assert values[0.039] == (0.039, 0.0)
    # a warm row's level ceilings: the L2's read rose 25% (151 -> 188.75); the LLC's read (118 -> 147.5) is its own
    assert subs["levels"]["l2"]["read_gbps"] == (pytest.approx(188.75), pytest.approx(0.25))
    assert subs["levels"]["llc"]["read_gbps"] == (pytest.approx(147.5), pytest.approx(0.25))
    assert subs["levels"]["l2"]["write_gbps"] == (97.0, 0.0)
    unmoved = ceiling_drift.substitutions(before(), before(), None)
    assert all(math.isnan(d) for _, d in unmoved["values"].values())


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
