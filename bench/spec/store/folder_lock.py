"""One writer per folder: DIR/phasebench.lock, held (flock) by the process that writes DIR and naming it (pid, host,
command, since when); a second writer is refused in one line naming the holder, and a lock whose holder died is taken
over with a note. Readers take no lock."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shlex
import socket
import sys
from pathlib import Path

from .files import WriteError, note, remove_temporaries

try:
    import fcntl
except ImportError:  # no flock (Windows): the pid the lock file names decides
    fcntl = None

LOCK_NAME = "phasebench.lock"
_held: dict[str, list] = {}  # resolved folder -> [fd, depth]: a process that holds a folder may enter it again


class FolderBusy(RuntimeError):
    """The folder is being written by another process (one line naming it)."""


def this_command() -> str:
    """This process's command line, as a holder shows it (`phasebench run ...` for the CLI)."""
    argv = list(sys.argv) or ["python"]
    if argv[0].endswith(("phasebench", "__main__.py")):
        argv[0] = "phasebench"
    return shlex.join(argv)


def holder_text(info: dict) -> str:
    """'pid 4242 on host h since 2026-01-01T10:00:00+00:00 (phasebench run --out x)' of a lock file's content."""
    command = " ".join(str(info.get("command") or "").split())  # one line, whatever the command held
    command = f" ({command[:300]}{'...' if len(command) > 300 else ''})" if command else ""
    return f"pid {info.get('pid', '?')} on {info.get('host', '?')} since {info.get('since', '?')}{command}"


def read_holder(folder) -> dict | None:
    """Who holds (or last held, when it died) the lock of `folder`; None where there is no lock file or it is
    empty."""
    try:
        info = json.loads((Path(folder) / LOCK_NAME).read_text() or "null")
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def _alive(info: dict) -> bool:
    """Whether the holder a lock file names still runs (known only on its own host)."""
    if info.get("host") != socket.gethostname() or not isinstance(info.get("pid"), int):
        return False
    if os.name == "nt":  # os.kill(pid, 0) would send a Ctrl-C there: a lock that stays is removed by hand
        return True
    try:
        os.kill(info["pid"], 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _busy(folder: Path) -> FolderBusy:
    return FolderBusy(f"{folder} is being written by {holder_text(read_holder(folder) or {})}; wait for it to end "
                      "or choose another folder")


def _take(path: Path) -> tuple[int, dict | None]:
    """An fd holding the lock file's flock, and what the file named before (a dead holder's note); FolderBusy when a
    live process holds it."""
    for _ in range(10):  # the holder may remove the file between our open and flock: open it again
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)  # no write handle held: a remount read-only works
        except OSError as err:
            raise WriteError(path, err) from None
        try:
            if fcntl is None:
                raise OSError("no flock here")
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _busy(path.parent) from None
        except OSError:  # a filesystem without flock: the pid the file names decides
            before = read_holder(path.parent)
            if before and _alive(before) and before.get("pid") != os.getpid():
                os.close(fd)
                raise _busy(path.parent) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd, read_holder(path.parent)
        os.close(fd)
    raise FolderBusy(f"{path.parent}: its lock file keeps changing; another writer is starting there")


def acquire(folder, command: str | None = None, say=None) -> None:
    """Hold `folder` (created if needed) for this process's writes; FolderBusy (one line naming the holder) when
    another process holds it. A lock a dead process left is taken over, and `say` (default: stderr) gets one line
    about it. A process may acquire a folder it holds again (each acquire needs its release)."""
    folder = Path(folder)
    key = str(folder.resolve())
    if key in _held:
        _held[key][1] += 1
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise WriteError(folder, err) from None
    path = folder / LOCK_NAME
    fd, before = _take(path)
    info = {"pid": os.getpid(), "host": socket.gethostname(), "command": command or this_command(),
            "since": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    try:
        with open(path, "r+b") as fh:
            fh.truncate(0)
            fh.write(json.dumps(info).encode() + b"\n")
    except OSError as err:
        os.close(fd)
        raise WriteError(path, err) from None
    _held[key] = [fd, 1]
    if before and before.get("pid") != os.getpid():
        (say or note)(f"{folder}: took over the lock of {holder_text(before)}, which is no longer running")
    remove_temporaries(folder)


def release(folder) -> None:
    """Let go of `folder` (the lock file goes when the last acquire of this process is released)."""
    key = str(Path(folder).resolve())
    entry = _held.get(key)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] > 0:
        return
    del _held[key]
    with contextlib.suppress(OSError):
        os.unlink(Path(key) / LOCK_NAME)  # before the fd closes: a writer waiting on this file opens a new one
    os.close(entry[0])


@contextlib.contextmanager
def holding(folder, command: str | None = None, say=None):
    """`acquire` for the length of a block."""
    acquire(folder, command, say)
    try:
        yield
    finally:
        release(folder)
