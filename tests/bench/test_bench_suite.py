"""The pytest-benchmark suite in a subprocess: readable ids, extra_info figures, a tidy JSON."""

from __future__ import annotations

import json
import subprocess
import sys

from ..conftest import REPO


def test_benchmark_suite_writes_tidy_json(bench_json):
    data = json.loads(bench_json.read_text())
    benches = data["benchmarks"]
    assert len(benches) == 8  # the 4 quick CPU cases x 2 impls
    names = {b["name"] for b in benches}
    assert "test_attention[b2-h32/8-q1-k512-d128-causal-decode-naive]" in names
    for b in benches:
        info = b["extra_info"]
        for key in ("impl", "backend", "mode", "phase", "flops", "bytes", "intensity", "tflops", "gbps",
                    "pct_roofline", "bound", "batch", "q_heads", "kv_heads", "q_len", "kv_len", "head_dim",
                    "causal", "dtype"):
            assert key in info, key
        assert info["tflops"] > 0 and info["bound"] in ("compute", "memory")
        assert b["stats"]["rounds"] >= 5
        median_s = b["stats"]["median"]
        assert abs(info["tflops"] - info["flops"] / median_s / 1e12) <= 1e-9 * info["tflops"] + 1e-12


def test_root_pytest_collects_only_the_tests_folder():
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    collected = [line for line in proc.stdout.splitlines() if "::" in line]
    assert collected and all(line.startswith("tests/") for line in collected)
