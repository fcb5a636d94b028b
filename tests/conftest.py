"""Session-wide test settings: the xdist workers, one ceilings cache and one Inductor cache for the whole run, a quick
run shared by end-to-end tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# `python -m pytest` spreads tests/ over this many pytest-xdist workers (CI's 2 cores), a whole file at a time
DEFAULT_WORKERS = 2
# seconds a (case, impl) may take in a CLI run of the tests before it is called hung: a verdict never depends on how
# busy the host is (the default, 10x an impl's longest row, failed naive linear on a loaded host); the tests of the
# timeout itself give --case-timeout
CASE_TIMEOUT_S = 900


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """Without -n, the whole suite runs on DEFAULT_WORKERS workers, each test file on one worker (its module fixtures
    run once). A marker selection (`-m cuda`, the self-check's passes) or a CUDA host runs in one process unless -n
    is given: the `gpu_exclusive` tests must not share the GPU. `-n 0` runs in this process."""
    option = config.option
    if (not config.pluginmanager.hasplugin("xdist") or getattr(option, "numprocesses", 0) is not None
            or option.collectonly or option.markexpr or config.getoption("usepdb", False)
            or os.environ.get("PYTEST_XDIST_WORKER")):
        return
    import torch

    if torch.cuda.is_available():
        return
    option.numprocesses = DEFAULT_WORKERS
    if option.dist == "no":
        option.dist = "loadfile"


def pytest_configure(config):
    # ceilings are measured once per test session and shared with subprocesses (xdist workers too) through the env
    if "PHASEBENCH_CACHE" not in os.environ:
        os.environ["PHASEBENCH_CACHE"] = tempfile.mkdtemp(prefix="phasebench-cache-")
    # the host's ceilings too (each `phasebench` command would measure them, seconds each): tests of the host's
    # own measuring take the variable out
    os.environ.setdefault("PHASEBENCH_HOST_CEILINGS", os.path.join(os.environ["PHASEBENCH_CACHE"], "host"))
    os.environ.setdefault("PHASEBENCH_CASE_TIMEOUT", f"{CASE_TIMEOUT_S}")
    # one round per `phasebench run` of the tests (each further round starts a worker process: seconds); the quick run
    # and the tests of the rounds themselves ask for theirs
    os.environ.setdefault("PHASEBENCH_ROUNDS", "1")
    # one Inductor cache for the session (in the same folder), as a developer's default cache is: the `phasebench run`
    # commands of the tests keep it (a run makes an empty one of its own only where none is set), so a shape that
    # flex or compiled compiled once is not compiled cold by each command again
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(os.environ["PHASEBENCH_CACHE"], "inductor"))
    _share_the_cores()


def _share_the_cores():
    """Each xdist worker (and the commands it starts) gets its share of the host's CPUs as torch threads: two
    workers of 2 threads each on 2 cores time-slice their OpenMP teams, and a GEMM of ~0.15 ms then takes a
    scheduler quantum (8 ms, seen in the dry run's log). Only threads change; no verdict depends on them."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers < 2 or "OMP_NUM_THREADS" in os.environ:
        return
    threads = str(max(1, len(os.sched_getaffinity(0)) // workers))
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = threads
    import torch

    torch.set_num_threads(int(threads))


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true",
                     help="run the slow tier only: the end-to-end runs marked `slow` (CI runs both tiers)")


def pytest_collection_modifyitems(config, items):
    """The tier: `pytest` leaves the tests marked `slow` out, `pytest --slow` runs those only. Tests marked `cuda`
    skip, with the reason, where no CUDA device is."""
    slow = config.getoption("slow")
    tier = {True: [], False: []}
    for item in items:
        tier[(item.get_closest_marker("slow") is not None) == slow].append(item)
    if tier[False]:
        config.hook.pytest_deselected(items=tier[False])
        items[:] = tier[True]
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


def run_cli(*args: str, timeout: float = 900, cwd=None, unset: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """`phasebench ARGS` in a fresh interpreter, as a user would run it (without the environment variables `unset`)."""
    env = {k: v for k, v in os.environ.items() if k not in unset}
    return subprocess.run([sys.executable, "-m", "phasebench.bench.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, stdin=subprocess.DEVNULL, env=env)


def run_pytest_bench(out: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`pytest bench --benchmark-json OUT ARGS` in a fresh interpreter (never as an xdist worker: pytest-benchmark
    5.2.2+ switches itself off where PYTEST_XDIST_WORKER is set, which a child would inherit)."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    return subprocess.run([sys.executable, "-m", "pytest", str(REPO / "bench"), "-q", "-p", "no:cacheprovider",
                           f"--benchmark-json={out}", "--benchmark-columns=median,rounds", *args],
                          capture_output=True, text=True, env={**inherited, **(env or {})}, cwd=out.parent,
                          timeout=1200, stdin=subprocess.DEVNULL)


def once_per_session(tmp_path_factory, name: str, make) -> tuple[Path, subprocess.CompletedProcess]:
    """`make(folder)` (a command that writes into `folder`) once per test session, whichever xdist worker asks first:
    the others wait for it, then get the same folder and the same outcome, failure included."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's folder, above each worker's
    folder, outcome = root / name, root / f"{name}.outcome.json"
    with FileLock(str(root / f"{name}.lock")):
        if not outcome.exists():
            folder.mkdir()
            proc = make(folder)
            outcome.write_text(json.dumps({"args": [str(a) for a in proc.args], "returncode": proc.returncode,
                                           "stdout": proc.stdout, "stderr": proc.stderr}))
    done = json.loads(outcome.read_text())
    return folder, subprocess.CompletedProcess(done["args"], done["returncode"], done["stdout"], done["stderr"])


@pytest.fixture(scope="session")
def bench_json(tmp_path_factory) -> Path:
    """`pytest bench --benchmark-json` on the quick cases of the best device (naive and flash), once per session."""
    folder, proc = once_per_session(tmp_path_factory, "bench", lambda out: run_pytest_bench(
        out / "bench.json", env={"PHASEBENCH_IMPL": "naive,flash"}))
    assert proc.returncode == 0, proc.stdout[-3000:]
    return folder / "bench.json"


@pytest.fixture(scope="session")
def quick_run(tmp_path_factory) -> Path:
    """The default `phasebench run` (quick suite, best device here, its default rounds) into a temp folder, once per
    session."""
    out, proc = once_per_session(tmp_path_factory, "quick-run", lambda out: run_cli(
        "run", "--out", str(out), timeout=1800, unset=("PHASEBENCH_ROUNDS",)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out
