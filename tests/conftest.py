"""Session-wide test settings: one ceilings cache for the whole run, a quick run shared by end-to-end tests."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    # ceilings are measured once per test session and shared with subprocesses through the env
    if "PHASEBENCH_CACHE" not in os.environ:
        os.environ["PHASEBENCH_CACHE"] = tempfile.mkdtemp(prefix="phasebench-cache-")


def pytest_collection_modifyitems(config, items):
    """Tests marked `cuda` skip, with the reason, where no CUDA device is."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


def run_cli(*args: str, timeout: float = 300, cwd=None) -> subprocess.CompletedProcess:
    """`phasebench ARGS` in a fresh interpreter, as a user would run it."""
    return subprocess.run([sys.executable, "-m", "phasebench.bench.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, stdin=subprocess.DEVNULL)


def run_pytest_bench(out: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`pytest bench --benchmark-json OUT ARGS` in a fresh interpreter (never as an xdist worker: pytest-benchmark
    5.2.2+ switches itself off where PYTEST_XDIST_WORKER is set, which a child would inherit)."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    return subprocess.run([sys.executable, "-m", "pytest", str(REPO / "bench"), "-q", "-p", "no:cacheprovider",
                           f"--benchmark-json={out}", "--benchmark-columns=median,rounds", *args],
                          capture_output=True, text=True, env={**inherited, **(env or {})}, cwd=out.parent,
                          timeout=600, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="session")
def bench_json(tmp_path_factory) -> Path:
    """`pytest bench --benchmark-json` on the quick cases of the best device (naive and flash), run once per session."""
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    proc = run_pytest_bench(out, env={"PHASEBENCH_IMPL": "naive,flash"})
    assert proc.returncode == 0, proc.stdout[-3000:]
    return out


@pytest.fixture(scope="session")
def quick_run(tmp_path_factory) -> Path:
    """The default `phasebench run` (quick suite, best device here) into a temp folder, run once per session."""
    out = tmp_path_factory.mktemp("quick-run")
    proc = run_cli("run", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out
