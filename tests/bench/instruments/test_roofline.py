"""Measured ceilings, their cache and provenance, datasheet and load warnings, and `phasebench ceilings`."""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
import time
from datetime import datetime
from pathlib import Path

import pytest
import torch
from phasebench.bench.instruments import ceiling_measures, conditions, roofline

from ...conftest import run_cli

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def cpu_ceilings():
    return roofline.ceilings(CPU, ("float32",))


class Fake:
    """Instant measurements: fixed figures per stream and dtype (a probe at half the size reads 0.9x), that a test may
    move; no buffers are made."""

    def __init__(self):
        rng = random.Random(1234)
        self.figures = {"read": rng.uniform(30.0, 77.0), "write": rng.uniform(3.0, 20.0),
                        "copy": rng.uniform(20.0, 60.0), **{d: rng.uniform(0.01, 1.7) for d in roofline.TORCH_DTYPES}}
        self.calls: list[str] = []

    def stream(self, device, stream, cfg, buffers=None):
        self.calls.append(stream if cfg is not roofline.PROBE_TIMER else f"probe {stream}")
        return {"gbps": self.figures[stream], "kernel": f"{stream}-kernel", "kernels": {f"{stream}-kernel":
                self.figures[stream]}, "buffer_bytes": 4096}

    def matmul(self, device, dtype, cfg, n=None):
        self.calls.append(dtype if cfg is not roofline.PROBE_TIMER else f"probe {dtype}")
        return self.figures[dtype] * (1.0 if n == 2048 else 0.9)

    def measured(self) -> list[str]:
        return [c for c in self.calls if not c.startswith("probe")]


MEASURED = ["read", "write", "copy"]  # what a measurement of the ceilings measures before its dtypes


class NoBuffers:
    def __init__(self, device, nbytes=None):
        self.nbytes = 4096


@pytest.fixture
def fake_measure(monkeypatch, tmp_path):
    """A private cache, a fresh in-process memo and instant measurements; the Fake counts them."""
    monkeypatch.setenv("PHASEBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(roofline.HOST_KEEP_ENV, raising=False)  # the tests' shared folder (tests/conftest.py)
    monkeypatch.setattr(roofline, "_this_process", {})
    fake = Fake()
    for module in (roofline, ceiling_measures):
        monkeypatch.setattr(module, "measure_stream", fake.stream)
        monkeypatch.setattr(module, "StreamBuffers", NoBuffers)
    monkeypatch.setattr(roofline, "measure_matmul", fake.matmul)
    monkeypatch.setattr(roofline, "measure_levels", lambda device, cfg: {})  # measure_levels has tests of its own
    monkeypatch.setattr(roofline, "best_matmul",
                        lambda device, dtype, cfg: (fake.matmul(device, dtype, cfg, n=2048), 2048))
    # instant measurements make windows of a few /proc/stat ticks, where one tick of another process reads as load:
    # the machine counts as quiet unless a test says otherwise
    monkeypatch.setattr(roofline, "load_warnings", lambda conditions, what="ceilings": [])
    return fake


def entry_path(device=CPU) -> Path:
    return roofline.cache_dir() / f"ceilings-{roofline.fingerprint(device)}.json"


def test_cpu_ceilings_are_sane(cpu_ceilings):
    # measured figures, finite and positive (how high is a speed: `phasebench ceilings` reports it); the load
    # warning follows the conditions it was measured under
    for gbps in (cpu_ceilings.read_gbps, cpu_ceilings.write_gbps, cpu_ceilings.copy_gbps):
        assert math.isfinite(gbps) and gbps > 0
    assert cpu_ceilings.copy_gbps == cpu_ceilings.peak_gbps  # the one figure before schema 5 is the copy
    assert math.isfinite(cpu_ceilings.peak_tflops["float32"]) and cpu_ceilings.peak_tflops["float32"] > 0
    share = cpu_ceilings.conditions.get("others_cpu_share")
    warned = any(w.startswith("ceilings measured under load") for w in cpu_ceilings.warnings)
    assert warned == (share is not None and share > conditions.OTHERS_CPU_SHARE_LIMIT), (share, cpu_ceilings.warnings)
    assert cpu_ceilings.kind == "cpu" and cpu_ceilings.device
    peak = cpu_ceilings.peak_tflops["float32"]
    assert cpu_ceilings.ridge("float32") == pytest.approx(peak * 1000 / cpu_ceilings.read_gbps)
    assert cpu_ceilings.ridge("float32", "copy") == pytest.approx(peak * 1000 / cpu_ceilings.copy_gbps)
    low = cpu_ceilings.roof_tflops("float32", 1e-3)  # the copy roof of an intensity, as before schema 5
    assert low == pytest.approx(1e-3 * cpu_ceilings.copy_gbps / 1000)
    assert cpu_ceilings.roof_tflops("float32", 1e9) == cpu_ceilings.peak_tflops["float32"]
    assert cpu_ceilings.source in ("measured", "cached") and cpu_ceilings.duration_s > 0
    assert datetime.fromisoformat(cpu_ceilings.measured_at).utcoffset().total_seconds() == 0
    assert cpu_ceilings.matmul_n["float32"] in (256, 512, 1024, 2048)
    for stream in ("read", "write", "copy"):  # each stream with its own provenance, inside the whole measurement
        found = cpu_ceilings.bandwidth[stream]
        assert found["gbps"] == getattr(cpu_ceilings, f"{stream}_gbps") and found["kernel"] in found["kernels"]
        assert found["buffer_bytes"] >= 256 << 20 and found["duration_s"] > 0 and "cpu_count" in found["conditions"]
        assert cpu_ceilings.measured_at <= found["measured_at"]
    read = cpu_ceilings.bandwidth["read"]  # the fastest of three read kernels
    assert set(read["kernels"]) == {"dot", "sum", "gemv"} and read["gbps"] == max(read["kernels"].values())
    caches = cpu_ceilings.caches
    assert caches["llc_bytes"] >= 1 << 20 and caches["source"] and "statistic" in cpu_ceilings.to_json()
    for level, found in cpu_ceilings.levels.items():  # the streams resident in the L2 and the LLC, where listed
        assert found["bytes"] == caches[f"{level}_bytes"] and found["bandwidth"]["read"]["buffer_bytes"] < found[
            "bytes"]
        assert all(math.isfinite(found[f"{s}_gbps"]) and found[f"{s}_gbps"] > 0 for s in ("read", "write", "copy"))


def test_a_rows_roof_is_its_read_and_write_floor(fake_measure):
    ceil = roofline.ceilings(CPU, ("float32",))
    r, w, f = 3_000_017.0, 999_983.0, 7.0e7  # a read-mostly row (a GEMV's shape of bytes) and its FLOPs
    read_s, write_s = r / (ceil.read_gbps * 1e9), w / (ceil.write_gbps * 1e9)
    paired = 2 * w / (ceil.copy_gbps * 1e9) + (r - w) / (ceil.read_gbps * 1e9)
    floor = min(read_s + write_s, paired)
    roof_tflops, roof_s, bound, model = ceil.roof("float32", f, r, w, r + w)
    assert roof_s == pytest.approx(max(floor, f / (ceil.peak_tflops["float32"] * 1e12)))
    assert roof_tflops == pytest.approx(min(ceil.peak_tflops["float32"], f / floor / 1e12)) and model == "read+write"
    assert bound == ("memory" if floor > f / (ceil.peak_tflops["float32"] * 1e12) else "compute")
    # an operator that gives no read/write split: all its bytes at the copy bandwidth, and it says so
    roof_tflops, roof_s, _, model = ceil.roof("float32", f, None, None, r + w)
    assert model == "copy" and roof_tflops == pytest.approx(ceil.roof_tflops("float32", f / (r + w)))


def test_the_host_measures_in_each_run_and_reuses_within_a_process(fake_measure):
    first = roofline.ceilings(CPU, ("float32",))
    assert first.source == "measured" and "host measures" in first.checked
    assert not entry_path().exists()  # nothing cached for another run
    again = roofline.ceilings(CPU, ("float32",))
    assert again.source == "cached" and "this process" in again.checked
    assert fake_measure.measured() == [*MEASURED, "float32"]
    assert (again.peak_gbps, again.peak_tflops) == (first.peak_gbps, first.peak_tflops)
    roofline._this_process.clear()  # as a new process finds it
    fake_measure.figures["read"] *= 0.6
    fresh = roofline.ceilings(CPU, ("float32",))
    assert fresh.source == "measured" and fresh.read_gbps == pytest.approx(0.6 * first.read_gbps)
    assert fresh.copy_gbps == first.copy_gbps


def test_a_host_keep_folder_measures_once_and_serves_every_run_after(fake_measure, monkeypatch, tmp_path):
    kept = tmp_path / "kept"
    monkeypatch.setenv(roofline.HOST_KEEP_ENV, str(kept))
    monkeypatch.setattr(roofline, "load_warnings", lambda conditions, what="ceilings": ["ceilings measured under load"])
    first = roofline.ceilings(CPU, ("float32",))
    assert first.source == "measured" and "none kept" in first.checked and len(list(kept.glob("ceilings-*.json"))) == 1
    roofline._this_process.clear()  # a new process
    fake_measure.figures["read"] *= 0.5
    again = roofline.ceilings(CPU, ("float32",))
    assert again.source == "cached" and "kept in" in again.checked and again.read_gbps == first.read_gbps
    assert "ceilings measured under load" in again.warnings  # a busy measurement is kept with its warning
    assert fake_measure.measured() == [*MEASURED, "float32"]  # no probe, nothing measured again
    more = roofline.ceilings(CPU, ("float32", "bfloat16"))  # a dtype not kept yet is measured and added
    assert more.source == "cached" and fake_measure.measured()[-1] == "bfloat16"
    assert "bfloat16" in roofline.ceilings(CPU, ("bfloat16",)).peak_tflops
    own = roofline.ceilings(CPU, ("float32",), cached=False)  # the host's own rule, the folder left alone
    assert own.source == "measured" and own.read_gbps == pytest.approx(0.5 * first.read_gbps)
    fresh = roofline.ceilings(CPU, ("float32",), refresh=True)
    assert fresh.source == "measured" and fresh.checked == "measured: --refresh"
    roofline._this_process.clear()
    assert roofline.ceilings(CPU, ("float32",)).read_gbps == pytest.approx(0.5 * first.read_gbps)  # kept anew
    (path,) = kept.glob("ceilings-*.json")  # kept before schema 7: no cache-level ceilings, so measured again
    path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != "levels"}))
    older = roofline.ceilings(CPU, ("float32",))
    assert older.source == "measured" and "no cache-level ceilings" in older.checked


def test_a_kept_entry_whose_cache_levels_were_measured_one_pass_a_call_is_measured_again(fake_measure, monkeypatch,
                                                                                          tmp_path):
    """Cache-level ceilings of one pass a call were mostly a call's dispatch (an L2 read at half its rate): an entry
    kept with them is measured again; one whose calls made their passes is served as kept."""
    kept = tmp_path / "kept"
    monkeypatch.setenv(roofline.HOST_KEEP_ENV, str(kept))
    passes = {s: {"gbps": 150.0, "passes": 256} for s in ("read", "write", "copy")}
    level = {"bytes": 2 << 20, "read_gbps": 150.0, "write_gbps": 150.0, "copy_gbps": 150.0, "bandwidth": passes}
    monkeypatch.setattr(roofline, "measure_levels", lambda device, cfg: {"l2": level})
    roofline.ceilings(CPU, ("float32",))
    roofline._this_process.clear()
    assert roofline.ceilings(CPU, ("float32",)).source == "cached"
    (path,) = kept.glob("ceilings-*.json")
    entry = json.loads(path.read_text())
    entry["levels"]["l2"]["bandwidth"] = {s: {"gbps": 80.0} for s in ("read", "write", "copy")}
    path.write_text(json.dumps(entry))
    older = roofline.ceilings(CPU, ("float32",))
    assert older.source == "measured" and "cache-level ceilings of one pass a call" in older.checked


def test_a_cache_level_measured_below_a_farther_one_is_named_in_the_ceilings_warnings(fake_measure, monkeypatch):
    """The L2's own read under the LLC's: the ceilings keep both as measured and say, in their warnings (run.json's
    ceilings.warnings, `phasebench ceilings`), which figure its warm rows are judged at."""
    levels = {"l2": {"bytes": 2 << 20, "read_gbps": 84.2, "write_gbps": 500.0, "copy_gbps": 500.0},
              "llc": {"bytes": 32 << 20, "read_gbps": 172.5, "write_gbps": 400.0, "copy_gbps": 400.0}}
    monkeypatch.setattr(roofline, "measure_levels", lambda device, cfg: levels)
    ceil = roofline.ceilings(CPU, ("float32",))
    assert ceil.levels["l2"]["read_gbps"] == 84.2  # as measured
    (warning,) = [w for w in ceil.warnings if w.startswith("l2 ceilings below")]
    assert "read at the llc's 172.5 GB/s (the l2's own 84.2)" in warning and "level_note" in warning
    assert warning in ceil.to_json()["warnings"] and not any(w.startswith("llc ceilings") for w in ceil.warnings)


@pytest.mark.slow
def test_two_host_runs_each_measure_their_ceilings():
    found = [json.loads(run_cli("ceilings", "--device", "cpu", "--json", unset=(roofline.HOST_KEEP_ENV,)).stdout)
             for _ in range(2)]
    assert [f["source"] for f in found] == ["measured", "measured"]
    assert found[0]["measured_at"] <= found[1]["measured_at"] and all("host measures" in f["checked"] for f in found)


def test_cache_entry_holds_the_provenance(fake_measure, monkeypatch):
    instant = fake_measure.stream

    def busy_stream(device, stream, cfg, buffers=None):  # spends some CPU so that /proc/stat's 10 ms ticks see it
        start = time.process_time()
        while time.process_time() - start < 0.05:
            pass
        return instant(device, stream, cfg, buffers)

    monkeypatch.setattr(ceiling_measures, "measure_stream", busy_stream)
    result = roofline.ceilings(CPU, ("float32", "bfloat16"), cached=True)
    entry = json.loads(entry_path().read_text())
    assert entry["peak_gbps"] == result.peak_gbps == entry["copy_gbps"] and entry["peak_tflops"] == result.peak_tflops
    assert (entry["read_gbps"], entry["write_gbps"]) == (result.read_gbps, result.write_gbps)
    assert (result.read_gbps, result.write_gbps, result.copy_gbps) == tuple(fake_measure.figures[s] for s in MEASURED)
    assert fake_measure.measured() == [*MEASURED, "float32", "bfloat16"]
    assert entry["matmul_n"] == {"float32": 2048, "bfloat16": 2048}
    assert set(entry["probe"]) == {*MEASURED, "float32", "bfloat16"}  # the probe holds the three streams too
    for stream in MEASURED:  # each stream's own provenance: when, how long, under what conditions, with what
        own = entry["bandwidth"][stream]
        assert own == result.bandwidth[stream] and own["kernel"] == f"{stream}-kernel" and own["buffer_bytes"] == 4096
        assert own["duration_s"] > 0 and entry["measured_at_epoch"] <= own["measured_at_epoch"]
        assert own["conditions"]["cpu_count"] == os.cpu_count()
        assert datetime.fromisoformat(own["measured_at"]).utcoffset().total_seconds() == 0
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
    assert set(json_out) >= {"device", "kind", "peak_gbps", "peak_tflops", "datasheet", "age_s", "warnings",
                             "checked", "matmul_n", "read_gbps", "write_gbps", "copy_gbps", "bandwidth"}
    assert json_out["copy_gbps"] == json_out["peak_gbps"] and json_out["bandwidth"] == entry["bandwidth"]


def test_a_cached_entry_is_held_by_a_probe_and_measured_again_when_it_drifts(fake_measure):
    first = roofline.ceilings(CPU, ("float32",), cached=True)
    assert first.source == "measured" and first.provenance().startswith("measured now")
    again = roofline.ceilings(CPU, ("float32",), cached=True)
    assert fake_measure.measured() == [*MEASURED, "float32"]  # the probe only, the second time
    assert fake_measure.calls.count("probe write") == 2  # the probe taken with the entry, and the one now
    assert again.source == "cached" and "within 0%" in again.checked and again.provenance().startswith("cached")
    assert (again.measured_at, again.duration_s, again.conditions) == (first.measured_at, first.duration_s,
                                                                      first.conditions)
    # a dtype missing from the cache is measured and added with its own provenance, the rest is kept
    more = roofline.ceilings(CPU, ("float32", "float16"), cached=True)
    assert fake_measure.measured()[4:] == ["float16"] and more.source == "cached"
    assert more.peak_tflops["float32"] == first.peak_tflops["float32"] and set(more.added) == {"float16"}
    assert set(more.added["float16"]) == {"measured_at", "measured_at_epoch", "duration_s", "conditions"}
    assert json.loads(entry_path().read_text())["added"]["float16"] == more.added["float16"]
    # the machine changed (a throttled clock, a busy neighbour): 8% is within the probe's tolerance, 30% is not
    fake_measure.figures["float32"] *= 1.08
    assert roofline.ceilings(CPU, ("float32",), cached=True).source == "cached"
    fake_measure.figures["float32"] *= 1.3
    moved = roofline.ceilings(CPU, ("float32",), cached=True)
    assert moved.source == "measured" and "differs by 40% from the cached entry's (float32)" in moved.checked
    assert moved.peak_tflops["float32"] == pytest.approx(1.08 * 1.3 * first.peak_tflops["float32"])
    fake_measure.figures["write"] *= 1.3  # a stream that moved is caught by the probe as a matmul is
    moved = roofline.ceilings(CPU, ("float32",), cached=True)
    assert moved.source == "measured" and "(write)" in moved.checked
    fresh = roofline.ceilings(CPU, ("float32",), refresh=True, cached=True)
    assert fresh.source == "measured" and fresh.checked == "measured: --refresh" and fresh.added == {}


@pytest.mark.parametrize("edit", ["torch", "driver", "old format"])
def test_entry_from_other_versions_is_remeasured(fake_measure, edit):
    roofline.ceilings(CPU, ("float32",), cached=True)
    entry = json.loads(entry_path().read_text())
    if edit == "torch":
        entry["versions"]["torch"] = "1.13.1+cu117"
    elif edit == "driver":
        entry["versions"]["driver"] = "470.256.02"
    else:  # what the cache held before it recorded provenance
        entry = {k: entry[k] for k in ("device", "kind", "peak_gbps", "peak_tflops")}
    entry_path().write_text(json.dumps(entry))
    again = roofline.ceilings(CPU, ("float32",), cached=True)
    assert again.source == "measured" and fake_measure.measured() == [*MEASURED, "float32"] * 2
    assert json.loads(entry_path().read_text())["versions"] == roofline.versions(CPU)


def test_an_entry_without_read_and_write_ceilings_is_measured_again(fake_measure):
    roofline.ceilings(CPU, ("float32",), cached=True)
    entry = json.loads(entry_path().read_text())
    for name in ("read_gbps", "write_gbps", "copy_gbps", "bandwidth"):  # written before schema 5: the copy alone
        del entry[name]
    entry["probe"] = {k: v for k, v in entry["probe"].items() if k not in ("read", "write")}
    entry_path().write_text(json.dumps(entry))
    again = roofline.ceilings(CPU, ("float32",), cached=True)
    assert again.source == "measured" and "no read and write ceilings" in again.checked
    assert fake_measure.measured() == [*MEASURED, "float32"] * 2 and set(again.bandwidth) == set(MEASURED)


def test_an_entry_without_a_probe_is_measured_again(fake_measure):
    roofline.ceilings(CPU, ("float32",), cached=True)
    entry = json.loads(entry_path().read_text())
    del entry["probe"]  # written before the probe existed
    entry_path().write_text(json.dumps(entry))
    again = roofline.ceilings(CPU, ("float32",), cached=True)
    assert again.source == "measured" and "no probe" in again.checked


def test_driver_change_is_remeasured(fake_measure, monkeypatch):
    driver = {"now": "550.54.15"}
    monkeypatch.setattr(roofline, "versions", lambda device: {"torch": torch.__version__, "driver": driver["now"]})
    roofline.ceilings(CPU, ("float32",), cached=True)
    assert roofline.ceilings(CPU, ("float32",), cached=True).source == "cached"
    driver["now"] = "560.35.03"
    assert roofline.ceilings(CPU, ("float32",), cached=True).source == "measured"
    assert roofline.ceilings(CPU, ("float32",), cached=True).source == "cached"


@pytest.mark.parametrize("cached", [True, False])
def test_ceilings_measured_on_a_busy_machine_serve_their_run_and_are_never_kept(fake_measure, monkeypatch, cached):
    monkeypatch.setattr(roofline, "load_warnings", lambda conditions, what="ceilings": [f"{what} measured under load"])
    busy = roofline.ceilings(CPU, ("float32",), cached=cached)
    assert busy.source == "measured" and "ceilings measured under load" in busy.warnings
    assert "kept for no other run" in busy.checked
    assert not entry_path().exists() and roofline._this_process == {}
    again = roofline.ceilings(CPU, ("float32",), cached=cached)
    assert again.source == "measured" and fake_measure.measured() == [*MEASURED, "float32"] * 2


@pytest.mark.parametrize("ratio,warns", [(0.2, True), (1.5, True), (0.8, False)])
def test_datasheet_warning_outside_its_range(fake_measure, monkeypatch, ratio, warns):
    sheet = roofline.datasheet_for("NVIDIA H200")
    monkeypatch.setattr(roofline, "device_name", lambda device: "NVIDIA H200")
    # a datasheet's bandwidth compares with the read stream: the copy (and the write) are far under it on any device
    fake_measure.figures.update(read=ratio * sheet.peak_gbps, copy=0.2 * ratio * sheet.peak_gbps,
                                write=0.1 * ratio * sheet.peak_gbps,
                                **{d: ratio * tf for d, tf in sheet.peak_tflops.items()})
    for _ in range(2):  # measured, then cached: the check holds for both
        result = roofline.ceilings(CPU, ("bfloat16", "float32"), cached=True)
        lines = [w for w in result.warnings if "datasheet" in w]
        if not warns:
            assert lines == []
            continue
        assert len(lines) == 3, lines
        for what, measured, spec in [("read bandwidth", ratio * 4800, 4800), ("matmul bfloat16", ratio * 989, 989),
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


def test_cached_entry_measured_under_load_warns(fake_measure, monkeypatch):
    roofline.ceilings(CPU, ("float32",), cached=True)
    monkeypatch.setattr(roofline, "load_warnings", conditions.load_warnings)
    entry = json.loads(entry_path().read_text())  # an entry another phasebench cached under load
    entry["conditions"].update(others_cpu_share=0.61, throttle=["hw_slowdown"], other_pids=[31337])
    entry_path().write_text(json.dumps(entry))
    result = roofline.ceilings(CPU, ("float32",), cached=True)
    assert result.source == "cached" and fake_measure.measured() == [*MEASURED, "float32"]
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


@pytest.mark.slow
def test_ceilings_cli():
    table = run_cli("ceilings", "--device", "cpu", unset=(roofline.HOST_KEEP_ENV,))
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert "ridge" in table.stdout and "^3" in table.stdout
    assert "source: measured now" in table.stdout and "host measures" in table.stdout
    assert "conditions: " in table.stdout
    for stream, kernel in (("read", "dot"), ("write", "fill"), ("copy", "copy")):  # each figure, then its provenance
        at = next(i for i, line in enumerate(lines) if line.strip().startswith(f"{stream} "))
        assert f"{stream} bandwidth" in lines[at] and "GB/s measured" in lines[at]
        assert lines[at + 1].strip().startswith(kernel) and "MiB; at 20" in lines[at + 1] and "took" in lines[at + 1]
        assert "cpu_count=" in lines[at + 1]
    assert "read bytes / read GB/s + write bytes / write GB/s" in table.stdout
    warned = [line for line in table.stdout.splitlines() if line.startswith("  warning: ")]
    # on a host the warnings are the load one, which says how much of the CPU others used, and a cache level's own
    # figures below a farther level's, which says what its warm rows are judged at
    load = r"ceilings measured under load: other processes used \d+% of the host CPU"
    level = r"(l2|llc) ceilings below a farther level's: .* GB/s \(the (l2|llc)'s own [\d.]+\).*level_note says so"
    assert all(re.fullmatch(rf"  warning: ({load}|{level})", line) for line in warned), warned
    calls = [line for line in lines if line.strip().startswith("a call: read ")]  # each level's passes a call
    assert len(calls) == sum("resident in the" in line for line in lines) and all("passes of" in c for c in calls)
