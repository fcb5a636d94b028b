"""Child processes under a wall-clock allowance: output teed to a log as it comes, stopped with SIGINT then SIGKILL."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

GRACE_S = 8.0  # after SIGINT: time to write what was measured (the CLI catches it, the runner's finally runs)


@dataclass(frozen=True)
class ChildResult:
    """How a child ended: its exit status (negative: the signal that ended it), seconds, whether it ran out of time."""

    command: tuple[str, ...]
    returncode: int | None
    elapsed_s: float
    overran: bool
    tail: str  # its last lines of output

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.overran


def allowance(left_s: float, budgets: Sequence[float]) -> float:
    """The first item's allowance out of `left_s` seconds, when it and the items after it were budgeted
    `budgets`: its share of what is left in proportion to its budget, so time saved earlier carries forward and
    time overspent earlier is taken evenly from the rest."""
    total = sum(budgets)
    if total <= 0 or left_s <= 0:
        return 0.0
    return left_s * budgets[0] / total


def _pump(stream, log: TextIO, echo: TextIO | None, lines: list[str]) -> None:
    for line in iter(stream.readline, ""):
        log.write(line)
        log.flush()
        if echo is not None:
            echo.write(line)
            echo.flush()
        lines.append(line)
        del lines[:-40]


def sigint_default() -> None:
    """In a child before it runs: SIGINT back to its default. A parent that ignores it (nohup, a pytest-xdist
    worker) would hand the child an ignored SIGINT, and Python then never raises KeyboardInterrupt: the stop that
    lets a child keep what it measured would wait out its grace and kill it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _stop(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGINT to the child's process group (its own children too), SIGKILL after the grace period."""
    for sig, wait_s in ((signal.SIGINT, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_child(command: Sequence[str], allowance_s: float, log: TextIO, *, echo: TextIO | None = None,
              cwd: Path | None = None, env: dict | None = None, grace_s: float = GRACE_S) -> ChildResult:
    """Run `command` for at most `allowance_s` seconds (then SIGINT, and SIGKILL `grace_s` later), its stdout and
    stderr appended to `log` (and `echo`) line by line, so what it printed survives however it ends."""
    command = tuple(str(c) for c in command)
    log.write(f"$ {shlex.join(command)}\n")
    log.flush()
    start = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            text=True, errors="replace", cwd=cwd, env={**os.environ, **(env or {})},
                            start_new_session=True, preexec_fn=sigint_default)
    lines: list[str] = []
    reader = threading.Thread(target=_pump, args=(proc.stdout, log, echo, lines), daemon=True)
    reader.start()
    overran = False
    try:
        proc.wait(timeout=max(allowance_s, 0.0))
    except subprocess.TimeoutExpired:
        overran = True
        _stop(proc, grace_s)
    except BaseException:
        _stop(proc, grace_s)
        raise
    reader.join(timeout=5)
    elapsed = time.monotonic() - start
    if overran:
        log.write(f"[stopped after its allowance of {allowance_s:.0f} s]\n")
        log.flush()
    return ChildResult(command, proc.returncode, elapsed, overran, "".join(lines))
