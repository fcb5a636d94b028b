"""Budgeted child processes: allowances that carry time forward, output kept line by line, SIGINT then SIGKILL."""

from __future__ import annotations

import io
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest
from phasebench.bench.session.child_process import allowance, run_child


def test_allowance_is_a_proportional_share_of_what_is_left():
    assert allowance(100, [10, 30, 60]) == pytest.approx(10)
    assert allowance(50, [30, 60]) == pytest.approx(50 / 3)  # 40 s saved earlier: shared in proportion
    assert allowance(10, [30, 60]) == pytest.approx(10 / 3)  # overspent earlier: taken evenly from the rest
    assert allowance(-5, [1, 2]) == 0 and allowance(10, [0, 0]) == 0 and allowance(10, [0, 3]) == 0


def _python(code: str) -> list[str]:
    return [sys.executable, "-u", "-c", textwrap.dedent(code)]


def test_a_child_that_finishes_in_time():
    log = io.StringIO()
    result = run_child(_python("print('first'); print('second'); raise SystemExit(3)"), 30, log)
    assert result.returncode == 3 and not result.overran and not result.ok
    assert "first\nsecond\n" in log.getvalue() and result.tail.endswith("second\n")
    assert log.getvalue().startswith("$ ")  # the command line heads its output


def test_an_overrunning_child_gets_sigint_and_keeps_what_it_wrote(tmp_path):
    saved = tmp_path / "saved"
    code = f"""
        import time
        print('measuring', flush=True)
        try:
            time.sleep(60)
        except KeyboardInterrupt:
            open({str(saved)!r}, 'w').write('rows')
            print('interrupted; rows written so far are kept', flush=True)
            raise SystemExit(130)
    """
    log = io.StringIO()
    result = run_child(_python(code), 3.0, log, grace_s=120)  # a loaded host starts Python slowly
    assert result.overran and result.returncode == 130  # interrupted in its 60 s sleep: it wrote what it had
    assert saved.read_text() == "rows"
    assert "measuring" in log.getvalue() and "rows written so far are kept" in log.getvalue()
    assert "stopped after its allowance of 3 s" in log.getvalue()


def test_a_child_that_ignores_sigint_is_killed_with_its_children(tmp_path):
    grandchild_pid = tmp_path / "pid"
    code = f"""
        import signal, subprocess, sys, time
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])
        open({str(grandchild_pid)!r}, 'w').write(str(child.pid))
        print('ignoring', flush=True)
        time.sleep(120)
    """
    result = run_child(_python(code), 1.5, io.StringIO(), grace_s=0.5)
    assert result.overran and result.returncode == -9  # killed in its 120 s sleep
    pid = int(grandchild_pid.read_text())
    for _ in range(50):  # the whole process group got SIGKILL: the grandchild goes too
        if not _alive(pid):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"grandchild {pid} outlived its group's SIGKILL")


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped (a container's init may never reap it)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def test_a_parent_that_ignores_sigint_still_stops_its_child_with_it(tmp_path):
    """nohup or a pytest-xdist worker ignores SIGINT, and a child would inherit that: it gets SIGINT back."""
    code = """
        import time
        try:
            time.sleep(60)
        except KeyboardInterrupt:
            raise SystemExit(130)
    """
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        result = run_child(_python(code), 3.0, io.StringIO(), grace_s=120)
    finally:
        signal.signal(signal.SIGINT, before)
    assert result.overran and result.returncode == 130
