"""The device work of one run behind one interface: in this process, or in a Worker (bench.sweep.worker) whose death
or timeout becomes a failed row; the limit a (case, impl) may take before it is called hung."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

from .worker import (
    FIRST_ROW_S,
    FLOOR_S,
    IN_PROCESS,
    START_S,
    TIMES_EXPECTED,
    Isolation,
    Worker,
    WorkerError,
    autotune,
    close_device,
    device_ceilings,
    device_metadata,
    device_probe,
    measure_row,
    open_capture,
    open_device,
    settle_spares,
)


@dataclass
class CaseClock:
    """How long a (case, impl) may take before it is called hung: `setting` seconds (0: no limit), or by default
    TIMES_EXPECTED x the longest row of its impl so far (at least FLOOR_S), FIRST_ROW_S for an impl's first."""

    setting: float | None = None
    durations: dict[str, list[float]] = field(default_factory=dict)

    def limit(self, impl: str) -> float | None:
        if self.setting is not None:
            return self.setting or None
        mine = self.durations.get(impl, [])
        return FIRST_ROW_S if not mine else max(FLOOR_S, TIMES_EXPECTED * max(mine))

    def record(self, impl: str, seconds: float) -> None:
        self.durations.setdefault(impl, []).append(seconds)


class Executor:
    """The device work of one run: here, or (isolate) in a Worker whose death or timeout becomes a failed row."""

    def __init__(self, device, timer, *, detect_contention=True, capture=None, isolation: Isolation = IN_PROCESS):
        self.isolate = isolation.isolate
        self.clock = CaseClock(isolation.case_timeout)
        self._init = (open_device, (device, timer, detect_contention, capture))
        self.worker = Worker(isolation.plugins, self._init) if self.isolate else None

    def __enter__(self):
        settle_spares()  # workers started for later rounds finish their imports before anything is measured
        if not self.isolate:
            fn, args = self._init
            fn(*args)
        return self

    def __exit__(self, *exc):
        if self.isolate:
            self.worker.close()
        else:
            close_device()

    def call(self, fn, *args, timeout=None, doing="running"):
        """fn(*args) where the cases run (the worker, or here); a dead or hung worker raises WorkerError."""
        if not self.isolate:
            return fn(*args)
        return self.worker.call(fn, *args, timeout=timeout, doing=doing)

    def capture(self, capture) -> None:
        """Open a profiler's range around what follows; a replaced worker opens it again."""
        if capture is None:
            return
        fn, args = self._init
        self._init = (fn, (*args[:3], capture))
        if self.isolate:
            self.worker.init = self._init
        self.call(open_capture, capture, timeout=START_S, doing="opening the profiler")

    def describe(self) -> dict:
        """For run.json: where the cases ran, how many workers were started, the case timeout."""
        if not self.isolate:
            return {"isolated": False}
        return {"isolated": True, "workers_started": self.worker.starts,
                "case_timeout_s": self.clock.setting if self.clock.setting is not None else "default",
                "default_timeout": f"{FIRST_ROW_S:g} s for an impl's first row, then {TIMES_EXPECTED:g} x its "
                                   f"longest row, at least {FLOOR_S:g} s"}

    def ceilings(self, dtypes, refresh: bool = False, before=None, levels: bool = True):
        return self.call(device_ceilings, tuple(dtypes), refresh, before, levels, timeout=START_S,
                         doing="measuring the ceilings")

    def metadata(self) -> dict:
        return self.call(device_metadata, timeout=START_S, doing="reading the device")

    def probe(self, before, name: str) -> dict | None:
        """A short measurement of the ceilings now (a moment of the run: ceiling_drift.probe_moment; None where the
        host's kept ceilings judge every run)."""
        return self.call(device_probe, before, name, timeout=START_S, doing="probing the ceilings")

    def restart(self) -> bool:
        """A fresh worker process for what follows (its allocator, caches and threads start anew, as a rerun's
        would); True where there was one to replace, False in this process (--no-isolate)."""
        if not self.isolate:
            return False
        self.worker.close()
        return True

    def autotune(self) -> list:
        with contextlib.suppress(WorkerError):
            return self.call(autotune, timeout=START_S, doing="reading the autotune winners")
        return []

    def measure(self, case, impl: str, row: dict) -> dict:
        started = time.monotonic()
        try:
            out = self.call(measure_row, case, impl, row, timeout=self.clock.limit(impl),
                             doing="measuring this case")
        except WorkerError as err:
            out = {**row, "status": "failed", "reason": f"{err}; the worker was replaced"}
        self.clock.record(impl, time.monotonic() - started)
        return out
