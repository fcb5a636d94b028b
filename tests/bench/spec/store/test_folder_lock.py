"""One writer per folder: the lock names its holder, a second writer is refused in one line, a dead holder's lock is
taken over with a note, and a process may enter a folder it holds again."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from phasebench.bench.spec.store import folder_lock
from phasebench.bench.spec.store.files import WriteError
from phasebench.bench.spec.store.folder_lock import LOCK_NAME, FolderBusy

HOLD = """
import os, sys
from phasebench.bench.spec.store import folder_lock
folder_lock.acquire(sys.argv[1], "phasebench run --impl naive --out x")
print("held", flush=True)
if sys.argv[2] == "die":
    os.kill(os.getpid(), 9)
sys.stdin.read()
"""


def holder(folder, then: str) -> subprocess.Popen:
    """Another process that takes the folder's lock, then waits on its stdin ("wait") or dies holding it ("die")."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), then], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_the_lock_names_its_holder_and_a_process_may_enter_a_folder_it_holds_again(tmp_path):
    folder = tmp_path / "run"
    folder_lock.acquire(folder, "phasebench run --out run")
    folder_lock.acquire(folder)  # the store inside the CLI verb that holds it already
    info = folder_lock.read_holder(folder)
    assert info["pid"] == os.getpid() and info["host"] == socket.gethostname()
    assert info["command"] == "phasebench run --out run" and info["since"]
    folder_lock.release(folder)
    assert (folder / LOCK_NAME).exists()
    folder_lock.release(folder)
    assert not (folder / LOCK_NAME).exists()
    folder_lock.release(folder)  # once more: nothing held, nothing done
    text = folder_lock.holder_text({"pid": 7, "host": "h", "since": "t", "command": "python -c 'a\nb' " * 40})
    assert "\n" not in text and text.startswith("pid 7 on h since t (python -c 'a b'") and text.endswith("...)")
    assert len(text) < 330


def test_a_second_writer_is_refused_in_one_line_naming_the_holder(tmp_path):
    proc = holder(tmp_path, "wait")
    try:
        with pytest.raises(FolderBusy) as refused:
            folder_lock.acquire(tmp_path)
        text = str(refused.value)
        assert "\n" not in text and f"pid {proc.pid} on {socket.gethostname()}" in text
        assert "(phasebench run --impl naive --out x)" in text and "choose another folder" in text
    finally:
        proc.communicate("")
    with folder_lock.holding(tmp_path):  # the holder ended: the folder is free
        assert folder_lock.read_holder(tmp_path)["pid"] == os.getpid()


def test_a_lock_left_by_a_dead_process_is_taken_over_with_a_note(tmp_path):
    proc = holder(tmp_path, "die")
    proc.wait()
    assert folder_lock.read_holder(tmp_path)["pid"] == proc.pid  # its lock file stays behind
    notes = []
    with folder_lock.holding(tmp_path, say=notes.append):
        assert folder_lock.read_holder(tmp_path)["pid"] == os.getpid()
    assert len(notes) == 1 and f"took over the lock of pid {proc.pid}" in notes[0]
    assert "no longer running" in notes[0]


def test_without_flock_the_pid_the_lock_names_decides(tmp_path, monkeypatch):
    """A filesystem (or a system) without flock: a live holder on this host refuses, a dead one is taken over."""
    monkeypatch.setattr(folder_lock, "fcntl", None)
    proc = holder(tmp_path / "live", "wait")
    try:
        with pytest.raises(FolderBusy, match=f"pid {proc.pid} on "):
            folder_lock.acquire(tmp_path / "live")
    finally:
        proc.communicate("")
    dead = holder(tmp_path / "dead", "die")
    dead.wait()
    notes = []
    with folder_lock.holding(tmp_path / "dead", say=notes.append):
        assert folder_lock.read_holder(tmp_path / "dead")["pid"] == os.getpid()
    assert len(notes) == 1 and f"took over the lock of pid {dead.pid}" in notes[0]


def test_a_folder_that_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(WriteError, match=r"cannot write .*file/run: Not a directory"):
        folder_lock.acquire(tmp_path / "file" / "run")
