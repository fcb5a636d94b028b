"""Measured ceilings on the CPU, their cache, datasheets and `phasebench ceilings --json`."""

from __future__ import annotations

import json

import pytest
import torch
from phasebench.bench import roofline

from ..conftest import run_cli


@pytest.fixture(scope="module")
def cpu_ceilings():
    return roofline.ceilings(torch.device("cpu"), ("float32",))


def test_cpu_ceilings_are_sane(cpu_ceilings):
    assert 0.5 < cpu_ceilings.peak_gbps < 5000
    assert 1e-4 < cpu_ceilings.peak_tflops["float32"] < 100
    assert cpu_ceilings.kind == "cpu" and cpu_ceilings.device
    peak = cpu_ceilings.peak_tflops["float32"]
    assert cpu_ceilings.ridge("float32") == pytest.approx(peak * 1000 / cpu_ceilings.peak_gbps)
    low = cpu_ceilings.roof_tflops("float32", 1e-3)
    assert low == pytest.approx(1e-3 * cpu_ceilings.peak_gbps / 1000)
    assert cpu_ceilings.roof_tflops("float32", 1e9) == cpu_ceilings.peak_tflops["float32"]


def test_ceilings_come_from_the_cache_until_refreshed(cpu_ceilings, monkeypatch):
    def must_not_measure(*args):
        raise AssertionError("measured although cached")

    monkeypatch.setattr(roofline, "measure_bandwidth", must_not_measure)
    monkeypatch.setattr(roofline, "measure_matmul", must_not_measure)
    again = roofline.ceilings(torch.device("cpu"), ("float32",))
    assert again.peak_gbps == cpu_ceilings.peak_gbps
    monkeypatch.setattr(roofline, "measure_bandwidth", lambda device, cfg: 123.0)
    monkeypatch.setattr(roofline, "measure_matmul", lambda device, dtype, cfg: 0.5)
    fresh = roofline.ceilings(torch.device("cpu"), ("float32",), refresh=True)
    assert fresh.peak_gbps == 123.0 and fresh.peak_tflops == {"float32": 0.5}
    # a dtype missing from the cache is measured and added, the rest is kept
    more = roofline.ceilings(torch.device("cpu"), ("float32", "bfloat16"))
    assert more.peak_tflops == {"float32": 0.5, "bfloat16": 0.5}
    # leave the real figures in the cache for the other tests
    path = roofline.cache_dir() / f"ceilings-{roofline.fingerprint(torch.device('cpu'))}.json"
    path.write_text(json.dumps(cpu_ceilings.to_json()))


@pytest.mark.parametrize("name,sheet", [
    ("NVIDIA H200", "NVIDIA H200 SXM"), ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"),
    ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"), ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 SXM 80GB"),
    ("NVIDIA L4", "NVIDIA L4"), ("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090"),
])
def test_datasheets_match_device_names(name, sheet):
    assert roofline.datasheet_for(name).name == sheet
    assert roofline.datasheet_for("AMD EPYC 7413") is None


def test_h200_datasheet_ridge_is_about_206():
    sheet = roofline.datasheet_for("NVIDIA H200")
    assert sheet.peak_tflops["bfloat16"] * 1000 / sheet.peak_gbps == pytest.approx(206, abs=1)


def test_ceilings_json_cli(cpu_ceilings):
    proc = run_cli("ceilings", "--device", "cpu", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["device"] == cpu_ceilings.device
    assert data["peak_gbps"] > 0 and data["peak_tflops"]["float32"] > 0
    table = run_cli("ceilings", "--device", "cpu")
    assert "copy bandwidth" in table.stdout and "ridge" in table.stdout
