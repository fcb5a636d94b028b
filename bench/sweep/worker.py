"""The worker process of a sweep, where a crash, a hang, an OOM kill or a lost CUDA context costs one failed row,
never the sweep: the worker is long-lived, replaced when it dies, and started afresh for each round of a run.

The parent never touches the device (no CUDA context: the contention probe in the worker would see it as another
process on the GPU); it keeps the store, the budget and the order, and asks the worker for ceilings, metadata,
each (case, impl)'s row and the autotune winners. The same functions run in-process without isolation.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import threading
import time
from dataclasses import dataclass

FIRST_ROW_S = 300.0  # an impl's first row compiles and autotunes: it may take this long before it is called hung
FLOOR_S = 60.0  # no later row is called hung before this
TIMES_EXPECTED = 10.0  # nor before this many times the longest row of its impl so far
START_S = 300.0  # a worker that has not answered its first call by then (imports, plugins, CUDA) is stuck
POLL_S = 0.05
STICKY_CUDA = ("illegal memory access", "device-side assert", "unspecified launch failure", "misaligned address",
               "illegal instruction", "an illegal", "cudaErrorLaunchFailure", "CUDA error: an")


class WorkerError(RuntimeError):
    """The worker died, hung or was interrupted; the message is one line naming what happened."""


def signal_name(returncode: int | None) -> str:
    if returncode is None or returncode >= 0:
        return f"exit status {returncode}"
    try:
        return f"{signal.Signals(-returncode).name} (signal {-returncode})"
    except ValueError:
        return f"signal {-returncode}"


# ---- the worker's side: the functions the parent asks for, against one state per process -----------------------

_STATE: dict = {}


def open_device(device, timer, detect_contention: bool, capture=None) -> None:
    """Make the device current, keep the sampler and probe, and open the capture (a profiler's range) if given."""
    import torch

    from ..instruments.contention import ContentionProbe
    from ..instruments.roofline import on_device
    from .measure import HarnessSampler

    close_device()
    stack = contextlib.ExitStack()
    stack.enter_context(on_device(device))
    if capture is not None:
        stack.enter_context(capture())
    _STATE.update(device=torch.device(device), stack=stack, sampler=HarnessSampler(timer, torch.device(device).type),
                  probe=ContentionProbe(device) if detect_contention else None, case=None, state=None)


def open_capture(capture) -> None:
    """Open a profiler's range (a picklable factory of a context manager) until the device is closed."""
    _STATE["stack"].enter_context(capture())


def close_device() -> None:
    stack = _STATE.pop("stack", None)
    _STATE.clear()
    if stack is not None:
        stack.close()


def device_ceilings(dtypes, refresh: bool, before=None, levels: bool = True):
    """The device's ceilings (the host's cache levels only where `levels`: a row will be judged at one); with
    `before`, those measured again after the run (ceiling_drift.measure_again)."""
    from ..instruments.ceiling_drift import measure_again
    from ..instruments.roofline import ceilings

    if before is not None:
        return measure_again(_STATE["device"], before)
    return ceilings(_STATE["device"], tuple(dtypes), refresh=refresh, levels=levels)


def device_probe(before, name: str) -> dict | None:
    """A short measurement of the ceilings now, as a moment of the run (ceiling_drift.probe_moment); None where the
    host's kept ceilings judge every run by request (PHASEBENCH_HOST_CEILINGS: nothing is measured again)."""
    from ..instruments.ceiling_drift import probe_moment
    from ..instruments.roofline import host_keep_dir

    if _STATE["device"].type != "cuda" and host_keep_dir() is not None:
        return None
    return probe_moment(_STATE["device"], before, name)


def device_metadata() -> dict:
    from .metadata import run_metadata

    return run_metadata(_STATE["device"])


def autotune() -> list:
    from ...kernels.autotune import autotune_winners

    return autotune_winners()


def measure_row(case, impl: str, row: dict) -> dict:
    """One (case, impl)'s row; the case's inputs and reference are kept for its next impl and freed before the next
    case (its fit check sees the memory free)."""
    import torch

    from .measure import CaseState, measure, one_line

    device = _STATE["device"]
    try:  # whatever raises here (freeing the cache, the case's state) costs this row, never the sweep
        if _STATE.get("case") != case:
            _STATE.update(case=None, state=None)
            if device.type == "cuda":  # cached blocks would count as used in the next case's fit check
                torch.cuda.empty_cache()
            _STATE.update(case=case, state=CaseState(case, device))
        out = measure(_STATE["state"], impl, row, _STATE["sampler"], _STATE["probe"])
    except Exception as err:
        out = {**row, "status": "failed", "reason": one_line(err)}
    if device.type == "cuda" and out["status"] == "failed":
        lost = any(s in out["reason"] for s in STICKY_CUDA)
        try:
            torch.cuda.synchronize(device)
        except Exception:
            lost = True
        if lost:  # every later case in this process would fail the same way: the parent replaces the worker
            out["reason"] = f"{out['reason']} (the CUDA context was lost; the worker was replaced)"
            _STATE["lost"] = True
    return out


def release_case() -> None:
    """Drop the case held for its next impl (its inputs, copies and reference), e.g. before other work between rounds
    of a sweep; the next measure_row builds its case afresh."""
    _STATE.update(case=None, state=None)


def _serve(conn, plugins) -> None:
    """The worker's loop: load the plugins, then run each (fn, args, kwargs) sent and send back what it gave."""
    import faulthandler

    faulthandler.enable()  # a segfault prints its Python stack to the inherited stderr
    _exit_with_parent()
    try:
        from ...kernels import load_plugin
        from . import measure  # noqa: F401  (torch, the kernels, the gate: imported while the parent starts too)

        for plugin in plugins:  # the parent loaded them first: a bad one is its one-line error there
            load_plugin(plugin)
    except BaseException as err:  # reported on the first call
        conn.send(("raised", _portable(err)))
        return
    conn.send(("ready", None))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            close_device()
            return
        fn, args, kwargs = message
        try:
            conn.send(("ok", fn(*args, **kwargs)))
        except KeyboardInterrupt:
            conn.send(("interrupted", None))
            return
        except BaseException as err:
            conn.send(("raised", _portable(err)))
        if _STATE.get("lost"):
            return


def _exit_with_parent(every_s: float = 0.5) -> None:
    """A worker whose parent died (killed mid-call) ends within `every_s`, instead of timing on beside the next run."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="phasebench-parent-watch").start()


def _portable(err: BaseException) -> BaseException:
    """The exception itself where it pickles, else a RuntimeError with its one-line text."""
    import pickle

    try:
        pickle.loads(pickle.dumps(err))
        return err
    except Exception:
        text = str(err).strip().splitlines()
        return RuntimeError(f"{type(err).__name__}: {text[0] if text else ''}")


# ---- the parent's side ----------------------------------------------------------------------------------------

_SPARE: dict[tuple, list[tuple]] = {}  # plugins -> [(process, pipe)] started ahead by prestart(), oldest first


def _spawn(plugins: tuple) -> tuple:
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(child, plugins), daemon=True, name="phasebench-worker")
    proc.start()
    child.close()
    return proc, conn


def prestart(isolation: Isolation, workers: int = 1) -> None:
    """Start the interpreters of `workers` workers now (those not started yet), so that their imports overlap this
    process's own start-up, never a measurement (a verb calls this first thing; the run's Worker takes them over,
    one for each of its first rounds); each idles until it is taken."""
    if not isolation.isolate:
        return
    spares = _SPARE.setdefault(isolation.plugins, [])
    while len(spares) < workers:
        spares.append(_spawn(isolation.plugins))


def settle_spares(timeout: float = START_S) -> None:
    """Wait (up to `timeout` each) until every started worker has finished its imports and said so, without taking
    its message: nothing measured may share the CPUs with an interpreter still importing."""
    for spares in _SPARE.values():
        for proc, conn in spares:
            if proc.is_alive():
                conn.poll(timeout)


class Worker:
    """A long-lived child process (spawned: a fresh interpreter, safe beside CUDA) that runs picklable calls; after
    it dies the next call starts a new one and runs `init` there first."""

    def __init__(self, plugins=(), init: tuple | None = None):
        self.plugins, self.init = tuple(plugins or ()), init
        self.proc = self.conn = None
        self.starts = 0

    def _start(self) -> None:
        spares = _SPARE.get(self.plugins) or []
        self.proc, self.conn = spares.pop(0) if spares else _spawn(self.plugins)
        self.starts += 1
        self._wait(START_S, "starting")  # "ready", or the plugin's error
        if self.init is not None:
            fn, args = self.init
            self._send(fn, args, {})
            self._wait(START_S, "opening the device")

    def _send(self, fn, args, kwargs) -> None:
        self.conn.send((fn, args, kwargs))

    def _wait(self, timeout: float | None, doing: str):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            closed = False
            if self.conn.poll(POLL_S):
                try:
                    kind, value = self.conn.recv()
                except (EOFError, OSError):  # the worker's end closed: it died
                    kind, value, closed = None, None, True
                if kind in ("ok", "ready"):
                    return value
                if kind == "raised":
                    raise value
                if kind == "interrupted":
                    self._reap()
                    raise KeyboardInterrupt
            if closed or not self.proc.is_alive():
                self.proc.join(timeout=5.0)
                code = self.proc.exitcode
                self._reap()
                raise WorkerError(f"the worker died of {signal_name(code)} while {doing}")
            if deadline is not None and time.monotonic() > deadline:
                self.kill()
                raise WorkerError(f"timed out after {timeout:.0f} s while {doing} (--case-timeout); the worker "
                                  "was killed")

    def call(self, fn, *args, timeout: float | None = None, doing: str = "running", **kwargs):
        """fn(*args, **kwargs) in the worker; its exception is raised here, a death or a timeout as WorkerError."""
        if self.proc is None or not self.proc.is_alive():
            self._reap()
            self._start()
        self._send(fn, args, kwargs)
        try:
            return self._wait(timeout, doing)
        except KeyboardInterrupt:
            self.kill(grace_s=5.0)  # it got the same SIGINT: a moment to write what it was writing
            raise

    def _reap(self) -> None:
        """Forget a worker that has ended (or was never started)."""
        if self.proc is not None:
            self.proc.join(timeout=1.0)
        self.proc = self.conn = None

    def kill(self, grace_s: float = 0.0) -> None:
        """Stop the worker: `grace_s` to end by itself, then SIGKILL."""
        if self.proc is None:
            return
        if grace_s:
            self.proc.join(timeout=grace_s)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=5.0)
        self.proc = self.conn = None

    def close(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            with contextlib.suppress(OSError, BrokenPipeError):
                self.conn.send(None)
            self.proc.join(timeout=10.0)
        self.kill()


@dataclass(frozen=True)
class Isolation:
    """Where a run measures: in a worker process (`isolate`) that imports `plugins` (module names or .py paths)
    itself, with `case_timeout` seconds per (case, impl) (None: by default, 0: no limit); or in this process."""

    isolate: bool = True
    plugins: tuple[str, ...] = ()
    case_timeout: float | None = None

    def argv(self) -> list[str]:
        """The same choice as `phasebench` options (the plugins are given with --plugin on their own)."""
        return [*([] if self.isolate else ["--no-isolate"]),
                *([] if self.case_timeout is None else ["--case-timeout", f"{self.case_timeout:g}"])]


IN_PROCESS = Isolation(isolate=False)
