"""Measured ceilings, their cache and provenance, datasheet and load warnings, and `phasebench ceilings`."""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from datetime import datetime
from pathlib import Path

import pytest
import torch
from phasebench.bench.instruments import conditions, roofline

from ...conftest import run_cli

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def cpu_ceilings():
    return roofline.ceilings(CPU, ("float32",))


@pytest.fixture
def fake_measure(monkeypatch, tmp_path):
    """A private cache and instant measurements with seeded random figures; counts the measurements."""
    monkeypatch.setenv("PHASEBENCH_CACHE", str(tmp_path / "cache"))
    rng = random.Random(1234)
    calls = []

    def bandwidth(device, cfg):
        calls.append("copy")
        return rng.uniform(3.0, 77.0)

    def matmul(device, dtype, cfg):
        calls.append(dtype)
        return rng.uniform(0.01, 1.7)

    monkeypatch.setattr(roofline, "measure_bandwidth", bandwidth)
    monkeypatch.setattr(roofline, "measure_matmul", matmul)
    return calls


def entry_path(device=CPU) -> Path:
    return roofline.cache_dir() / f"ceilings-{roofline.fingerprint(device)}.json"


def test_cpu_ceilings_are_sane(cpu_ceilings):
    assert 0.5 < cpu_ceilings.peak_gbps < 5000
    assert 1e-4 < cpu_ceilings.peak_tflops["float32"] < 100
    assert cpu_ceilings.kind == "cpu" and cpu_ceilings.device
    peak = cpu_ceilings.peak_tflops["float32"]
    assert cpu_ceilings.ridge("float32") == pytest.approx(peak * 1000 / cpu_ceilings.peak_gbps)
    low = cpu_ceilings.roof_tflops("float32", 1e-3)
    assert low == pytest.approx(1e-3 * cpu_ceilings.peak_gbps / 1000)
    assert cpu_ceilings.roof_tflops("float32", 1e9) == cpu_ceilings.peak_tflops["float32"]
    assert cpu_ceilings.source in ("measured", "cached") and cpu_ceilings.duration_s > 0
    assert datetime.fromisoformat(cpu_ceilings.measured_at).utcoffset().total_seconds() == 0


def test_cache_entry_holds_the_provenance(fake_measure, monkeypatch):
    instant = roofline.measure_bandwidth

    def busy_bandwidth(device, cfg):  # spends some CPU so that /proc/stat's 10 ms ticks see the window
        start = time.process_time()
        while time.process_time() - start < 0.1:
            pass
        return instant(device, cfg)

    monkeypatch.setattr(roofline, "measure_bandwidth", busy_bandwidth)
    result = roofline.ceilings(CPU, ("float32", "bfloat16"))
    entry = json.loads(entry_path().read_text())
    assert entry["peak_gbps"] == result.peak_gbps and entry["peak_tflops"] == result.peak_tflops
    assert fake_measure == ["copy", "float32", "bfloat16"]
    stamp = datetime.fromisoformat(entry["measured_at"])
    assert stamp.utcoffset().total_seconds() == 0
    assert abs(stamp.timestamp() - entry["measured_at_epoch"]) < 1
    assert entry["duration_s"] >= 0 and entry["versions"] == {"torch": torch.__version__}
    cond = entry["conditions"]
    assert cond["cpu_count"] == os.cpu_count()
    if Path("/proc/loadavg").exists():
        assert len(cond["load_1m"]) == 2 and all(v >= 0 for v in cond["load_1m"])
        assert len(cond["running"]) == 2 and all(v >= 1 for v in cond["running"])  # this process runs
    if Path("/proc/stat").exists():
        assert 0 <= cond["others_cpu_share"] <= 1
    assert not any(k in cond for k in ("cpu_busy_s", "cpu_total_s", "self_cpu_s"))  # raw counters stay out
    json_out = result.to_json()
    assert json_out["source"] == "measured" and json_out["conditions"] == cond
    assert json_out["measured_at"] == entry["measured_at"] and json_out["duration_s"] == entry["duration_s"]
    assert set(json_out) >= {"device", "kind", "peak_gbps", "peak_tflops", "datasheet", "age_s", "warnings"}


def test_second_call_is_cached_until_refreshed(fake_measure):
    first = roofline.ceilings(CPU, ("float32",))
    assert first.source == "measured" and first.provenance().startswith("measured now")
    again = roofline.ceilings(CPU, ("float32",))
    assert len(fake_measure) == 2  # nothing measured the second time
    assert again.source == "cached" and again.age_s >= 0 and again.provenance().startswith("cached")
    assert (again.measured_at, again.duration_s, again.conditions) == (first.measured_at, first.duration_s,
                                                                      first.conditions)
    assert (again.peak_gbps, again.peak_tflops) == (first.peak_gbps, first.peak_tflops)
    # a dtype missing from the cache is measured and added with its own provenance, the rest is kept
    more = roofline.ceilings(CPU, ("float32", "float16"))
    assert fake_measure[2:] == ["float16"] and more.source == "cached"
    assert more.peak_tflops["float32"] == first.peak_tflops["float32"] and set(more.added) == {"float16"}
    assert set(more.added["float16"]) == {"measured_at", "measured_at_epoch", "duration_s", "conditions"}
    assert json.loads(entry_path().read_text())["added"]["float16"] == more.added["float16"]
    fresh = roofline.ceilings(CPU, ("float32",), refresh=True)
    assert fresh.source == "measured" and fake_measure[3:] == ["copy", "float32"]
    assert fresh.peak_gbps != first.peak_gbps and fresh.added == {}


@pytest.mark.parametrize("edit", ["torch", "driver", "old format"])
def test_entry_from_other_versions_is_remeasured(fake_measure, edit):
    first = roofline.ceilings(CPU, ("float32",))
    entry = json.loads(entry_path().read_text())
    if edit == "torch":
        entry["versions"]["torch"] = "1.13.1+cu117"
    elif edit == "driver":
        entry["versions"]["driver"] = "470.256.02"
    else:  # what the cache held before it recorded provenance
        entry = {k: entry[k] for k in ("device", "kind", "peak_gbps", "peak_tflops")}
    entry_path().write_text(json.dumps(entry))
    again = roofline.ceilings(CPU, ("float32",))
    assert again.source == "measured" and fake_measure == ["copy", "float32"] * 2
    assert again.peak_gbps != first.peak_gbps
    assert json.loads(entry_path().read_text())["versions"] == roofline.versions(CPU)


def test_driver_change_is_remeasured(fake_measure, monkeypatch):
    driver = {"now": "550.54.15"}
    monkeypatch.setattr(roofline, "versions", lambda device: {"torch": torch.__version__, "driver": driver["now"]})
    roofline.ceilings(CPU, ("float32",))
    assert roofline.ceilings(CPU, ("float32",)).source == "cached"
    driver["now"] = "560.35.03"
    assert roofline.ceilings(CPU, ("float32",)).source == "measured" and len(fake_measure) == 4
    assert roofline.ceilings(CPU, ("float32",)).source == "cached"


@pytest.mark.parametrize("ratio,warns", [(0.2, True), (1.5, True), (0.8, False)])
def test_datasheet_warning_outside_its_range(fake_measure, monkeypatch, ratio, warns):
    sheet = roofline.datasheet_for("NVIDIA H200")
    monkeypatch.setattr(roofline, "device_name", lambda device: "NVIDIA H200")
    monkeypatch.setattr(roofline, "measure_bandwidth", lambda device, cfg: ratio * sheet.peak_gbps)
    monkeypatch.setattr(roofline, "measure_matmul", lambda device, dtype, cfg: ratio * sheet.peak_tflops[dtype])
    for _ in range(2):  # measured, then cached: the check holds for both
        result = roofline.ceilings(CPU, ("bfloat16", "float32"))
        lines = [w for w in result.warnings if "datasheet" in w]
        if not warns:
            assert lines == []
            continue
        assert len(lines) == 3, lines
        for what, measured, spec in [("copy bandwidth", ratio * 4800, 4800), ("matmul bfloat16", ratio * 989, 989),
                                     ("matmul float32", ratio * 67, 67)]:
            line = next(w for w in lines if w.startswith(what))
            assert f"{measured:.4g}" in line and f"{spec:.4g}" in line and f"{ratio:.2f}x" in line
            assert "\n" not in line
    assert result.source == "cached"


def test_no_datasheet_no_datasheet_warning(fake_measure, monkeypatch):
    monkeypatch.setattr(roofline, "device_name", lambda device: "AMD EPYC 7413 24-Core Processor")
    result = roofline.ceilings(CPU, ("float32",))
    assert result.datasheet is None and not any("datasheet" in w for w in result.warnings)


def test_load_warnings():
    assert conditions.load_warnings({"others_cpu_share": 0.1, "throttle": ["gpu_idle"], "other_pids": []}) == []
    assert conditions.load_warnings({}) == []
    busy = conditions.load_warnings({"others_cpu_share": 0.37}, "matmul float16")
    assert busy == ["matmul float16 measured under load: other processes used 37% of the host CPU"]
    throttled = conditions.load_warnings({"throttle": ["gpu_idle", "sw_thermal_slowdown"]})
    assert len(throttled) == 1 and "sw_thermal_slowdown" in throttled[0] and "gpu_idle" not in throttled[0]
    shared = conditions.load_warnings({"other_pids": [4711, 90210]})
    assert len(shared) == 1 and "4711" in shared[0] and "90210" in shared[0]


def test_cached_entry_measured_under_load_warns(fake_measure):
    roofline.ceilings(CPU, ("float32",))
    entry = json.loads(entry_path().read_text())
    entry["conditions"].update(others_cpu_share=0.61, throttle=["hw_slowdown"], other_pids=[31337])
    entry_path().write_text(json.dumps(entry))
    result = roofline.ceilings(CPU, ("float32",))
    assert result.source == "cached" and len(fake_measure) == 2
    assert sum("measured under load" in w or "throttle" in w or "31337" in w for w in result.warnings) == 3


def test_others_cpu_share():
    rng = random.Random(7)
    total, busy, own = rng.uniform(100, 1e5), rng.uniform(10, 50), rng.uniform(0, 5)
    before = {"cpu_total_s": total, "cpu_busy_s": busy, "self_cpu_s": own}
    after = {"cpu_total_s": total + 13.0, "cpu_busy_s": busy + 9.1, "self_cpu_s": own + 5.2}
    assert conditions.others_cpu_share(before, after) == pytest.approx(3.9 / 13.0, abs=1e-3)
    assert conditions.others_cpu_share(before, before) is None  # no time passed
    assert conditions.others_cpu_share({}, after) is None
    assert conditions.others_cpu_share(after, {**after, "cpu_total_s": total + 20.0}) == 0.0  # never negative


def test_host_state_and_watch():
    state = conditions.host_state()
    assert state["self_cpu_s"] >= 0 and state["cpu_count"] == os.cpu_count()
    if Path("/proc/loadavg").exists():
        assert state["load_1m"] >= 0 and state["processes"] >= state["running"] >= 1
    gen = torch.Generator().manual_seed(3)
    a = torch.rand(301, 173, generator=gen)
    with conditions.watch(CPU) as record:
        assert record == {}  # filled when the block ends
        (a @ a.T).sum()
    assert record["cpu_count"] == os.cpu_count()
    if Path("/proc/loadavg").exists():
        assert len(record["load_1m"]) == 2
    line = conditions.describe(record)
    assert "\n" not in line and "cpu_count=" in line
    assert conditions.gpu_state(CPU) == {} and conditions.driver_version(CPU) is None


def test_merge_keeps_static_once_pairs_numbers_and_unions_lists():
    before = {"driver": "550.54.15", "sm_clock_mhz": 345, "sm_clock_max_mhz": 1980, "throttle": ["gpu_idle"],
              "other_pids": [12]}
    after = {"driver": "550.54.15", "sm_clock_mhz": 1755, "sm_clock_max_mhz": 1980, "throttle": ["sw_power_cap"],
             "other_pids": [], "power_w": 412.5}
    merged = conditions.merge(before, after)
    assert merged == {"driver": "550.54.15", "sm_clock_mhz": [345, 1755], "sm_clock_max_mhz": 1980,
                      "throttle": ["gpu_idle", "sw_power_cap"], "other_pids": [12], "power_w": [None, 412.5]}
    line = conditions.describe(merged)
    assert "sm_clock_mhz=345->1755" in line and "throttle=gpu_idle,sw_power_cap" in line and "?->412.5" in line


def fake_smi(reasons_field: str, apps: str):
    def smi(args):
        query = next(a for a in args if a.startswith("--query"))
        if query.startswith("--query-compute-apps"):
            return apps
        if "driver_version" in query and query.endswith("driver_version"):
            return "550.54.15\n"
        if reasons_field not in query and "reasons" in query:
            return None  # this driver's nvidia-smi does not know the field
        values = ["550.54.15", "1980", "1980", "2619", "2619", "[N/A]", "700.00", "41", "97"]
        return ", ".join(values + (["0x0000000000000004"] if reasons_field in query else [])) + "\n"
    return smi


@pytest.mark.parametrize("reasons_field", list(conditions.REASON_FIELDS) + ["none"])
def test_gpu_state_reads_nvidia_smi(monkeypatch, reasons_field):
    monkeypatch.setattr(conditions, "_smi_id", lambda device: "GPU-0f3c")
    monkeypatch.setattr(conditions, "smi", fake_smi(reasons_field, f"{os.getpid()}\n2718\n"))
    state = conditions.gpu_state(torch.device("cuda", 0))
    assert state["driver"] == "550.54.15" and state["sm_clock_mhz"] == 1980 and state["mem_clock_max_mhz"] == 2619
    assert "power_w" not in state and state["power_limit_w"] == 700.0 and state["utilization_pct"] == 97
    assert state["other_pids"] == [2718]  # this process is not "other"
    if reasons_field == "none":
        assert "throttle" not in state
    else:
        assert state["throttle"] == ["sw_power_cap"]
    assert conditions.driver_version(torch.device("cuda", 0)) == "550.54.15"


def test_gpu_state_never_raises(monkeypatch):
    monkeypatch.setattr(conditions, "_smi_id", lambda device: "GPU-0f3c")
    monkeypatch.setattr(conditions, "smi", lambda args: None)
    assert conditions.gpu_state(torch.device("cuda", 0)) == {}
    monkeypatch.setattr(conditions, "smi", lambda args: "garbage, , 0xZZ\n")
    assert isinstance(conditions.gpu_state(torch.device("cuda", 0)), dict)

    def broken(args):
        raise RuntimeError("NVML: driver/library version mismatch")

    monkeypatch.setattr(conditions, "smi", broken)
    assert conditions.gpu_state(torch.device("cuda", 0)) == {}


def test_throttle_reason_bits():
    assert conditions._throttle_reasons("0x0000000000000001") == ["gpu_idle"]
    assert conditions._throttle_reasons("0x0000000000000044") == ["sw_power_cap", "hw_thermal_slowdown"]
    assert conditions._throttle_reasons("0x0000000000000000") == []
    assert conditions._throttle_reasons("0x1000") == ["other_0x1000"]
    assert conditions._throttle_reasons("[N/A]") is None


@pytest.mark.cuda
def test_cuda_versions_and_conditions():
    device = torch.device("cuda", torch.cuda.current_device())
    found = roofline.versions(device)
    assert found["torch"] == torch.__version__ and found["cuda"] == torch.version.cuda and found["driver"]
    state = conditions.gpu_state(device)
    if shutil.which("nvidia-smi"):
        assert state["driver"] == found["driver"] and state["sm_clock_max_mhz"] > 0
        assert os.getpid() not in state.get("other_pids", [])


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


def test_ceilings_cli(cpu_ceilings):
    proc = run_cli("ceilings", "--device", "cpu", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["device"] == cpu_ceilings.device
    assert data["peak_gbps"] > 0 and data["peak_tflops"]["float32"] > 0
    # the fixture measured into the session cache, so the CLI reads the same figures from it
    assert data["source"] == "cached" and data["age_s"] >= 0 and data["measured_at"] == cpu_ceilings.measured_at
    assert data["conditions"] == cpu_ceilings.conditions and isinstance(data["warnings"], list)
    table = run_cli("ceilings", "--device", "cpu")
    assert "copy bandwidth" in table.stdout and "ridge" in table.stdout
    assert "source: cached, measured" in table.stdout and "conditions: " in table.stdout
    assert table.stdout.count("warning: ") == len(data["warnings"])
