"""Cases measured in a worker process: a kernel that segfaults, hangs, raises or asks for more memory than there is
costs one failed row, the worker is replaced, the sweep goes on, and --resume --retry-failed measures it again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
import torch
from phasebench.bench.session.child_process import sigint_default
from phasebench.bench.sweep import worker
from phasebench.bench.sweep.executor import CaseClock
from phasebench.bench.sweep.worker import Worker, WorkerError, signal_name

from ...conftest import REPO, run_cli

# Two impls a kernel can break in: `bad` misbehaves the way PHASEBENCH_BAD says on the cases whose kv_len is in
# PHASEBENCH_BAD_KV (so a --retry-failed with another setting can mend it); `fine` is naive attention.
PLUGIN = """
import ctypes, os, time
import torch
from phasebench.kernels import attention, register

def bad(q, k, v, *, causal=False, scale=None, cache_seqlens=None):
    if k.shape[2] in {int(x) for x in os.environ.get("PHASEBENCH_BAD_KV", "").split(",") if x}:
        how = os.environ.get("PHASEBENCH_BAD", "")
        if how == "segv":
            ctypes.string_at(0)
        if how == "hang":
            while True:
                time.sleep(1)
        if how == "raise":
            raise RuntimeError("the kernel found a bug in itself")
        if how == "oom":  # far beyond this machine's memory
            torch.empty(1 << 50, dtype=torch.uint8, device=q.device)
    return attention(q, k, v, impl="naive", causal=causal, scale=scale, cache_seqlens=cache_seqlens)

register("attention", "bad", bad, devices=("cpu", "cuda"), dtypes=("float32", "bfloat16", "float16"))
"""
SHAPES = ("batch=1,q_heads=2,kv_heads=1,q_len=1,kv_len=33,head_dim=16",
          "batch=2,q_heads=2,kv_heads=1,q_len=1,kv_len=47,head_dim=16",
          "batch=1,q_heads=2,kv_heads=1,q_len=1,kv_len=65,head_dim=16")


def _run(tmp_path, how: str, *extra: str, bad_kv: str = "47", timeout: float = 900):  # a guard against a hang only
    plugin = tmp_path / "breaking_kernels.py"
    plugin.write_text(PLUGIN)
    env = {**os.environ, "PHASEBENCH_BAD": how, "PHASEBENCH_BAD_KV": bad_kv}
    args = [sys.executable, "-m", "phasebench.bench.cli", "run", "--device", "cpu", "--plugin", str(plugin),
            "--impl", "naive", "bad", *[a for s in SHAPES for a in ("--shape", s)], "--sample-time", "0.02",
            "--out", str(tmp_path / "out"), *extra]
    started = time.monotonic()
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout, stdin=subprocess.DEVNULL)
    return proc, time.monotonic() - started


def _rows(tmp_path) -> pd.DataFrame:
    return pd.read_csv(tmp_path / "out" / "results.csv")


@pytest.mark.parametrize("how, reason", [
    ("segv", "the worker died of SIGSEGV"),
    ("raise", "RuntimeError: the kernel found a bug in itself"),
    pytest.param("oom", "alloc", marks=pytest.mark.slow),
])
def test_a_broken_kernel_costs_one_failed_row_and_the_sweep_goes_on(tmp_path, how, reason):
    proc, _ = _run(tmp_path, how)
    assert proc.returncode == 0, proc.stderr[-2000:]
    df = _rows(tmp_path)
    assert len(df) == 2 * len(SHAPES)
    broken = df[(df.impl == "bad") & (df.kv_len == 47)]
    assert len(broken) == 1 and broken.status.iloc[0] == "failed", broken[["status", "reason"]]
    assert reason.lower() in broken.reason.iloc[0].lower(), broken.reason.iloc[0]
    others = df.drop(broken.index)
    assert (others.status == "ok").all(), others[["impl", "kv_len", "status", "reason"]]
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["isolation"]["isolated"] and run["interrupted"] is False
    assert run["isolation"]["workers_started"] == (2 if how == "segv" else 1)


@pytest.mark.slow
def test_a_hanging_kernel_is_stopped_at_the_case_timeout_and_resume_retries_it(tmp_path):
    proc, _ = _run(tmp_path, "hang", "--case-timeout", "4")  # a run that waited for the hang fails at its timeout
    assert proc.returncode == 0, proc.stderr[-2000:]
    df = _rows(tmp_path)
    hung = df[(df.impl == "bad") & (df.kv_len == 47)]
    assert hung.status.iloc[0] == "failed" and "timed out after 4 s" in hung.reason.iloc[0]
    assert (df.drop(hung.index).status == "ok").all()
    # the kernel mended (it no longer hangs on that case): --retry-failed measures that row alone again
    again, _ = _run(tmp_path, "", "--resume", "--retry-failed")
    assert again.returncode == 0, again.stderr[-2000:]
    df = _rows(tmp_path)
    assert len(df) == 2 * len(SHAPES) and (df.status == "ok").all(), df[["impl", "kv_len", "status"]]


@pytest.mark.slow
def test_without_isolation_a_raising_kernel_is_still_one_failed_row(tmp_path):
    proc, _ = _run(tmp_path, "raise", "--no-isolate")
    assert proc.returncode == 0, proc.stderr[-2000:]
    df = _rows(tmp_path)
    assert (df.status == "failed").sum() == 1
    assert json.loads((tmp_path / "out" / "run.json").read_text())["isolation"] == {"isolated": False}


def test_ctrl_c_keeps_the_rows_and_closes_run_json_as_interrupted(tmp_path):
    plugin = tmp_path / "breaking_kernels.py"
    plugin.write_text(PLUGIN)
    env = {**os.environ, "PHASEBENCH_BAD": "hang", "PHASEBENCH_BAD_KV": "65"}  # the last case hangs
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "phasebench.bench.cli", "run", "--device", "cpu", "--plugin",
                             str(plugin), "--impl", "bad", *[a for s in SHAPES for a in ("--shape", s)],
                             "--sample-time", "0.02", "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, stdin=subprocess.DEVNULL,
                            start_new_session=True, preexec_fn=sigint_default)  # as a terminal's run has it
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:  # until the two good rows are written and the third hangs
            csv = out / "results.csv"
            if csv.is_file() and len(pd.read_csv(csv)) >= 2:
                break
            time.sleep(0.2)
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)  # a Ctrl-C at the terminal reaches the whole process group
        _, err = proc.communicate(timeout=300)  # a loaded host closes the run slowly
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err and "Traceback" not in err
    assert len(pd.read_csv(out / "results.csv")) == 2
    run = json.loads((out / "run.json").read_text())
    assert run["interrupted"] is True and run["finished"]


def test_the_worker_answers_calls_and_is_replaced_after_it_dies():
    w = Worker()
    try:
        assert w.call(os.getpid, timeout=120) != os.getpid()
        first = w.proc.pid
        with pytest.raises(WorkerError, match="SIGKILL"):
            w.call(os.kill, first, signal.SIGKILL, timeout=30, doing="killing itself")
        assert w.call(os.getpid, timeout=120) not in (first, os.getpid()) and w.starts == 2
        with pytest.raises(ZeroDivisionError):  # an exception comes back as itself; the worker lives on
            w.call(divmod, 1, 0, timeout=30)
        assert w.starts == 2
        with pytest.raises(WorkerError, match="timed out after 1 s"):
            w.call(time.sleep, 30, timeout=1)
    finally:
        w.close()


ORPHAN = """
import sys, time
from phasebench.bench.sweep.worker import Worker
w = Worker()
print(w.call(__import__("os").getpid, timeout=120), flush=True)
w.call(time.sleep, 600, timeout=900)  # the parent is killed in here
"""


def _alive(pid: int) -> bool:
    """Running (a zombie left unreaped by a container's init counts as ended)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


@pytest.mark.slow
def test_a_worker_ends_when_its_parent_is_killed_in_the_middle_of_a_call():
    """A verb killed mid-call must not leave its worker timing on beside the next run (it held a CPU for minutes)."""
    parent = subprocess.Popen([sys.executable, "-c", ORPHAN], stdout=subprocess.PIPE, text=True,
                              stdin=subprocess.DEVNULL)
    try:
        child = int(parent.stdout.readline())
        parent.kill()
        parent.wait(timeout=60)
        for _ in range(600):  # a liveness wait (up to a minute), not a timing
            if not _alive(child):
                break
            time.sleep(0.1)
        else:
            os.kill(child, signal.SIGKILL)
            pytest.fail(f"worker {child} lived on after its parent was killed")
    finally:
        parent.kill()


def test_case_clock_defaults_and_settings():
    clock = CaseClock()
    assert clock.limit("naive") == worker.FIRST_ROW_S  # a first row compiles and autotunes
    clock.record("naive", 0.5)
    assert clock.limit("naive") == worker.FLOOR_S
    clock.record("naive", 30.0)
    assert clock.limit("naive") == 30.0 * worker.TIMES_EXPECTED
    assert CaseClock(0).limit("naive") is None and CaseClock(7.5).limit("naive") == 7.5
    assert signal_name(-11) == "SIGSEGV (signal 11)" and signal_name(3) == "exit status 3"


def test_bad_case_timeouts_are_one_line(tmp_path):
    proc = run_cli("run", "--case-timeout", "-1", "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "case-timeout" in proc.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.cuda
def test_a_kernel_that_loses_the_cuda_context_costs_one_row_on_the_gpu(tmp_path):
    """An out-of-bounds Triton store poisons the context: that row fails, the worker is replaced, the rest are ok."""
    plugin = tmp_path / "oob.py"
    plugin.write_text(OOB_PLUGIN)
    shapes = [a for s in SHAPES for a in ("--shape", s)]
    proc = subprocess.run([sys.executable, "-m", "phasebench.bench.cli", "run", "--device", "cuda", "--plugin",
                           str(plugin), "--impl", "flash", "oob", *shapes, "--dtype", "float16",
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    df = _rows(tmp_path)
    broken = df[(df.impl == "oob") & (df.kv_len == 47)]
    assert broken.status.iloc[0] == "failed" and "worker" in broken.reason.iloc[0]
    assert (df.drop(broken.index).status == "ok").all(), df[["impl", "kv_len", "status", "reason"]]
    assert torch.cuda.is_available()


OOB_PLUGIN = """
import triton, triton.language as tl
import torch
from phasebench.kernels import attention, register

@triton.jit
def _scribble(ptr, n):
    offs = tl.arange(0, 1024)
    tl.store(ptr + offs * (1 << 30), tl.zeros((1024,), tl.float16))  # far outside the buffer, unmasked

def oob(q, k, v, *, causal=False, scale=None, cache_seqlens=None):
    if k.shape[2] == 47:
        buf = torch.empty(16, device=q.device, dtype=torch.float16)
        _scribble[(1,)](buf, 16)
        torch.cuda.synchronize()
    return attention(q, k, v, impl="flash", causal=causal, scale=scale, cache_seqlens=cache_seqlens)

register("attention", "oob", oob, devices=("cuda",), dtypes=("float16", "bfloat16"))
"""


@pytest.mark.parametrize("op", ["linear", "attention"])
def test_a_case_frees_its_tensors_when_the_next_case_takes_its_place_without_the_cycle_collector(op):
    """A repeated sweep (the phases check's rounds) measured the same cases again and again: tensors kept alive by
    reference cycles grew the worker by a case's inputs per case until rows were skipped for memory."""
    import gc
    import weakref

    from phasebench.bench.instruments.roofline import Ceilings
    from phasebench.bench.ops.attention.cases import AttentionCase
    from phasebench.bench.ops.linear.cases import LinearCase
    from phasebench.bench.sweep.measure import base_row
    from phasebench.bench.sweep.runner import CPU_TIMER

    cases = {"linear": [LinearCase(3, 97, 131, "float32", "decode"), LinearCase(5, 61, 33, "float32", "decode")],
             "attention": [AttentionCase(2, 4, 2, 1, 77, 16, True, "float32"),
                           AttentionCase(1, 2, 1, 9, 9, 8, True, "float32")]}[op]
    impl = "torch" if op == "linear" else "naive"
    ceil = Ceilings(device="cpu", kind="cpu", peak_gbps=10.0, peak_tflops={"float32": 0.1})
    worker.open_device(torch.device("cpu"), CPU_TIMER, False)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        row = worker.measure_row(cases[0], impl, base_row(cases[0], impl, "r", "s", ceil, "perf_counter_ns"))
        assert row["status"] == "ok", row.get("reason")
        state = worker._STATE["state"]
        held = [weakref.ref(t) for t in vars(state.inputs).values() if isinstance(t, torch.Tensor)]
        held.append(weakref.ref(state))
        del state
        worker.measure_row(cases[1], impl, base_row(cases[1], impl, "r", "s", ceil, "perf_counter_ns"))
        assert all(ref() is None for ref in held)
    finally:
        if was_enabled:
            gc.enable()
        worker.close_device()
