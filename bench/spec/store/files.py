"""Whole files and whole rows in a results folder: derived files renamed into place, appends that cannot tear a
folder, torn rows set aside in a side file, and a write that fails (a full disk, a read-only folder) named in one line.

A row is whole when it ends with its newline and parses: a CSV record with as many fields as the header, a JSON
line that is an object. An append writes its row in one write() and syncs it; one that fails is cut back to where
the file ended, and one that a kill cut short is found the next time the folder is opened, by its writer (which moves
it to NAME.torn beside the file) or by a reader (which leaves the file alone and reads the whole rows).

PHASEBENCH_FAULT is the tests' hook into these writes: `tear:NAME[:N]` stops the process (SIGKILL) after half of
the N-th write of a file NAME in it (every one when N is left out), `enospc:NAME[:N]` and `erofs:NAME[:N]` fail it
after half as a full disk or a read-only filesystem would; several are joined with commas."""

from __future__ import annotations

import contextlib
import csv
import errno
import json
import os
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

FAULT_ENV = "PHASEBENCH_FAULT"
TORN_SUFFIX = ".torn"
_TMP_MARK = ".phasebench-tmp"
_writes: dict[str, int] = {}  # appends and atomic writes per file name in this process, for PHASEBENCH_FAULT
_ERRNO = {"enospc": errno.ENOSPC, "erofs": errno.EROFS}


class WriteError(OSError):
    """A write into a folder that failed: `cannot write PATH: CAUSE` in one line (errno and path kept)."""

    def __init__(self, path, err: OSError):
        super().__init__(err.errno, err.strerror or str(err), str(path))

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror}"


class FolderWarning(UserWarning):
    """A reader's note about a folder it read around: torn rows left out, results.csv read in place of a missing or
    torn results.parquet."""


@dataclass(frozen=True)
class Torn:
    """Rows of `path` that are not whole: how many, their bytes, and the side file that keeps them (None when a
    reader only skipped them)."""

    path: Path
    rows: int
    nbytes: int
    side: Path | None = None

    def line(self) -> str:
        what = "a torn row" if self.rows == 1 else f"{self.rows} torn rows"
        where = f"set aside in {self.side.name}" if self.side else "left out (the folder's writer sets it aside)"
        return f"{self.path}: {what} ({self.nbytes} bytes, cut mid-write by a kill or a crash) {where}"


def note(line: str) -> None:
    """One line about a folder on stderr (a torn row set aside, a lock taken over)."""
    print(f"phasebench: {line}", file=sys.stderr, flush=True)


def _fault(path: Path) -> str | None:
    """The PHASEBENCH_FAULT action for this write of `path`, if any."""
    count = _writes[path.name] = _writes.get(path.name, 0) + 1
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return None
    for item in spec.split(","):
        action, _, rest = item.strip().partition(":")
        name, _, nth = rest.partition(":")
        if name == path.name and (not nth or int(nth) == count):
            return action
    return None


def _injected(action: str | None, fd: int, data: bytes) -> None:
    """Carry out a fault after half of `data` reached `fd`."""
    if action in ("tear", *_ERRNO):
        os.write(fd, data[: max(1, len(data) // 2)])
        if action == "tear":
            os.fsync(fd)
            os.kill(os.getpid(), signal.SIGKILL)
        raise OSError(_ERRNO[action], os.strerror(_ERRNO[action]))


def append_row(path, row: str, header: str | None = None) -> None:
    """`row` (one whole CSV record or JSON line, ending with its newline) appended to `path` in one write and synced;
    `header` first where the file is new or empty. A write that fails leaves the file as it was (the part written is
    cut off again) and raises WriteError."""
    path = Path(path)
    if not row.endswith("\n"):
        raise ValueError(f"row: must end with a newline, got {row[-20:]!r}")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as err:
        raise WriteError(path, err) from None
    size = 0
    try:
        size = os.fstat(fd).st_size
        data = ((header or "") if size == 0 else "").encode() + row.encode()
        _injected(_fault(path), fd, data)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, size)
        raise WriteError(path, err) from None
    finally:
        os.close(fd)


@contextlib.contextmanager
def replaced(path, mode: str = "w", **kw) -> Iterator:
    """A file to write `path` through: opened on a temporary name beside it, synced and renamed onto `path` when the
    block ends, so a reader sees the old file or the new one, never half of one. A write that fails (or an error in
    the block) removes the temporary file and leaves `path` as it was; an OSError becomes a WriteError."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}{_TMP_MARK}")
    try:
        with open(tmp, mode, **kw) as fh:
            yield fh
            fh.flush()
            action = _fault(path)
            if action:
                _injected(action, fh.fileno(), b"\0" * 64)
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        _sync_folder(path.parent)
    except OSError as err:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise WriteError(path, err) from None
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def write_file(path, data: str | bytes) -> None:
    """`data` as the whole of `path`, renamed into place (see `replaced`)."""
    with replaced(path, "wb") as fh:
        fh.write(data.encode() if isinstance(data, str) else data)


def write_table(path, frame) -> None:
    """A pandas DataFrame as CSV (no index) at `path`, renamed into place whole."""
    with replaced(path, "w", newline="") as fh:
        frame.to_csv(fh, index=False)


def _sync_folder(folder: Path) -> None:
    with contextlib.suppress(OSError):  # a folder cannot be opened for syncing everywhere
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def remove_temporaries(folder) -> None:
    """Remove the temporary files that writers killed mid-write left in `folder` (its writer calls this)."""
    for tmp in Path(folder).glob(f".*{_TMP_MARK}"):
        with contextlib.suppress(OSError):
            tmp.unlink()


# ---------------------------------------------------------------- whole rows


def _lines(data: bytes) -> list[bytes]:
    """`data` cut after each newline; a last part without one is a line of its own."""
    parts = data.split(b"\n")
    return [part + b"\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _csv_records(lines: list[bytes]) -> Iterator[tuple[bytes, bool]]:
    """(raw record, whole) of a CSV's lines: the header whole when it ends with its newline, each later record when
    it ends with its newline and has the header's number of fields (a quoted field may span lines)."""
    width, start = None, 0
    while start < len(lines):
        text = [line.decode("utf-8", "surrogateescape") for line in lines[start:]]
        reader = csv.reader(iter(text), strict=True)
        done = 0
        try:
            for fields in reader:
                raw = b"".join(lines[start + done:start + reader.line_num])
                done = reader.line_num
                if width is None:
                    width = len(fields) if raw.endswith(b"\n") else -1
                    yield raw, width > 0
                else:
                    yield raw, raw.endswith(b"\n") and len(fields) == width
            return
        except csv.Error:  # a quote left open to the end, or a stray one: the record it is in is torn
            end = max(reader.line_num, done + 1)
            yield b"".join(lines[start + done:start + end]), False
            start += end


def _json_records(lines: list[bytes]) -> Iterator[tuple[bytes, bool]]:
    for raw in lines:
        try:
            whole = raw.endswith(b"\n") and isinstance(json.loads(raw), dict)
        except ValueError:
            whole = False
        yield raw, whole


def split_whole(path, data: bytes) -> tuple[bytes, list[bytes]]:
    """The whole rows of `data` (a results CSV, or JSON lines for any other name) as bytes, and the torn ones."""
    records = _csv_records(_lines(data)) if Path(path).suffix == ".csv" else _json_records(_lines(data))
    good, bad = [], []
    for raw, whole in records:
        (good if whole else bad).append(raw)
    if bad and not good[:1] and Path(path).suffix == ".csv":  # no header left: nothing after it reads either
        return b"", bad
    return b"".join(good), bad


def read_whole(path) -> tuple[bytes, Torn | None]:
    """The whole rows of an appended file, for a reader (no lock, nothing written): its bytes without torn rows,
    and what was left out (None when nothing was)."""
    data = Path(path).read_bytes()
    good, bad = split_whole(path, data)
    return good, (Torn(Path(path), len(bad), sum(map(len, bad))) if bad else None)


def set_aside_torn(path) -> Torn | None:
    """For the folder's writer, on opening it: move the rows of `path` that are not whole to PATH.torn (appended to,
    so nothing is ever dropped), then keep the whole ones in `path`; None when every row is whole."""
    path = Path(path)
    if not path.is_file():
        return None
    data = path.read_bytes()
    good, bad = split_whole(path, data)
    if not bad:
        return None
    side = path.with_name(path.name + TORN_SUFFIX)
    kept = b"".join(raw if raw.endswith(b"\n") else raw + b"\n" for raw in bad)
    try:
        with open(side, "ab") as fh:
            fh.write(kept)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as err:
        raise WriteError(side, err) from None
    if data.startswith(good):  # the torn rows were the last ones: cut them off (no second copy on a full disk)
        try:
            os.truncate(path, len(good))
        except OSError as err:
            raise WriteError(path, err) from None
    else:
        write_file(path, good)
    return Torn(path, len(bad), sum(map(len, bad)), side)
