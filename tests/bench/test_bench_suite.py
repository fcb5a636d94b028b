"""The pytest-benchmark suite in a subprocess: readable ids, extra_info figures, a tidy JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from phasebench.bench.sweep.runner import impls_for
from phasebench.bench.sweep.selection import default_dtype, resolve_device
from phasebench.bench.sweep.suites import suite_cases

from ..conftest import REPO, run_pytest_bench

pytestmark = pytest.mark.slow  # `pytest bench` in subprocesses


def test_benchmark_suite_writes_tidy_json(bench_json):
    device = resolve_device(None)
    cases = suite_cases("quick", device.type, default_dtype(device))
    data = json.loads(bench_json.read_text())
    benches = data["benchmarks"]
    # the quick cases of the best device here, each with those of naive and flash its operator has
    assert len(benches) == sum(len(impls_for(c, ["naive", "flash"])) for c in cases)
    assert {b["extra_info"]["op"] for b in benches} == {"attention", "linear", "qlinear"}
    names = {b["name"] for b in benches}
    decode = next(c for c in cases if c.phase == "decode")
    assert f"test_kernel[attention-{decode.shape_label.replace(' ', '-')}-decode-naive]" in names
    case_keys = {"attention": ("batch", "q_heads", "kv_heads", "q_len", "kv_len", "head_dim", "causal"),
                 "linear": ("m", "n", "k", "projection"), "qlinear": ("m", "n", "k", "projection", "scheme")}
    for b in benches:
        info = b["extra_info"]
        for key in ("impl", "backend", "mode", "phase", "flops", "bytes", "intensity", "tflops", "gbps",
                    "pct_roofline", "bound", "dtype", "shape", *case_keys[info["op"]]):
            assert key in info, key
        assert info["tflops"] > 0 and info["bound"] in ("compute", "memory") and info["status"] == "ok"
        assert info["timer"] == ("pytest-benchmark" if info["device_kind"] == "cuda" else "pytest-benchmark+cold")
        assert isinstance(info["noisy"], bool)
        assert b["stats"]["rounds"] >= 6  # the fewest with a 95% interval of the median
        median_s = b["stats"]["median"]
        assert info["latency_ci_low_ms"] <= median_s * 1e3 <= info["latency_ci_high_ms"]
        assert info["latency_ci_rel"] >= 0 and isinstance(info["converged"], bool) and info["outliers"] >= 0
        # fixed rounds: `target` where they met it with halves that agree (bench.spec.interval.stop_reason_of)
        assert info["stop_reason"] in ("target", "fixed count", "drifting") and isinstance(info["drifting"], bool)
        assert info["converged"] == (info["stop_reason"] == "target") and info["first_half_ms"] > 0
        assert abs(info["tflops"] - info["flops"] / median_s / 1e12) <= 1e-9 * info["tflops"] + 1e-12


def test_root_pytest_collects_only_the_tests_folder():
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    collected = [line for line in proc.stdout.splitlines() if "::" in line]
    assert collected and all(line.startswith("tests/") for line in collected)


def test_a_plugin_kernel_is_gated_in_the_benchmark_suite(tmp_path):
    plugin = tmp_path / "plug.py"
    plugin.write_text(
        "from phasebench.kernels import attention, register\n"
        "def good(q, k, v, *, causal, scale, cache_seqlens):\n"
        "    return attention(q, k, v, impl='naive', causal=causal, scale=scale, cache_seqlens=cache_seqlens)\n"
        "def bad(q, k, v, *, causal, scale, cache_seqlens):\n"
        "    return attention(q, k, v, impl='naive', causal=causal, scale=2 * scale, cache_seqlens=cache_seqlens)\n"
        "register('attention', 'good', good)\nregister('attention', 'bad', bad)\n")
    out = tmp_path / "bench.json"
    proc = run_pytest_bench(out, "--plugin", str(plugin), "--impl", "good", "--impl", "bad", "-k", "decode or prefill")
    assert proc.returncode == 1, proc.stdout[-3000:]  # the wrong kernel fails its test
    assert "bad incorrect: worst row's relative error" in proc.stdout
    data = json.loads(out.read_text())
    impls = {b["extra_info"]["impl"] for b in data["benchmarks"]}
    assert impls == {"good"}


def test_a_crashing_kernel_fails_its_test_and_pytest_bench_goes_on(tmp_path):
    plugin = tmp_path / "crash.py"
    plugin.write_text(
        "import ctypes\n"
        "from phasebench.kernels import attention, register\n"
        "def crash(q, k, v, *, causal, scale, cache_seqlens):\n"
        "    ctypes.string_at(0)\n"
        "def good(q, k, v, *, causal, scale, cache_seqlens):\n"
        "    return attention(q, k, v, impl='naive', causal=causal, scale=scale, cache_seqlens=cache_seqlens)\n"
        "register('attention', 'crash', crash)\nregister('attention', 'good', good)\n")
    out = tmp_path / "bench.json"
    proc = run_pytest_bench(out, "--plugin", str(plugin), "--impl", "crash", "--impl", "good", "-k", "decode")
    assert proc.returncode == 1, proc.stdout[-3000:]  # pytest itself ended normally, with the crash as failures
    assert "crash failed: the worker died of SIGSEGV" in proc.stdout
    data = json.loads(out.read_text())
    assert {b["extra_info"]["impl"] for b in data["benchmarks"]} == {"good"}
    assert all(b["extra_info"]["status"] == "ok" for b in data["benchmarks"])
