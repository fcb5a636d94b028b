"""Whole files and whole rows: an append that fails leaves the file as it was, a row torn at any byte is found,
set aside (never dropped) or left out by a reader, and a derived file is the old one or the new one, never half."""

from __future__ import annotations

import csv
import errno
import io
import json
import random

import pytest
from phasebench.bench.spec.store import files
from phasebench.bench.spec.store.files import FAULT_ENV, WriteError

HEADER = "run_id,impl,reason,latency_ms\r\n"


def record(i: int, rng: random.Random) -> str:
    """A CSV record as the store writes it, some with a quoted reason that holds commas and a newline."""
    reason = rng.choice(["", "plain", "with, a comma", 'quoted "word"', "two\nlines"])
    text = io.StringIO()
    csv.writer(text).writerow([f"r{i}", rng.choice(["naive", "flash"]), reason, f"{rng.uniform(0.1, 9):.6f}"])
    return text.getvalue()


@pytest.fixture
def faults(monkeypatch):
    """Set PHASEBENCH_FAULT for one test, its write counts from zero."""
    monkeypatch.setattr(files, "_writes", {})
    return lambda spec: monkeypatch.setenv(FAULT_ENV, spec)


def test_appends_write_the_header_once_and_whole_rows(tmp_path):
    rng = random.Random(7)
    path = tmp_path / "results.csv"
    rows = [record(i, rng) for i in range(5)]
    for row in rows:
        files.append_row(path, row, header=HEADER)
    assert path.read_bytes().decode() == HEADER + "".join(rows)
    assert files.read_whole(path) == (path.read_bytes(), None)
    with pytest.raises(ValueError, match="row: must end with a newline"):
        files.append_row(path, "no newline")


@pytest.mark.parametrize("name, cause", [("results.csv", "enospc"), ("samples.jsonl", "erofs")])
def test_an_append_that_fails_leaves_the_file_as_it_was_and_says_so_in_one_line(tmp_path, faults, name, cause):
    path = tmp_path / name
    row = json.dumps({"key": {"impl": "naive"}, "samples_ms": [1.5] * 40}) + "\n"
    files.append_row(path, row)
    before = path.read_bytes()
    faults(f"{cause}:{name}:2")  # the second append: half of it reaches the file, then the write fails
    with pytest.raises(WriteError) as raised:
        files.append_row(path, row)
    assert path.read_bytes() == before
    code = {"enospc": errno.ENOSPC, "erofs": errno.EROFS}[cause]
    assert raised.value.errno == code and str(raised.value) == f"cannot write {path}: {__import__('os').strerror(code)}"
    files.append_row(path, row)  # the third goes through
    assert path.read_bytes() == before + row.encode()


def test_a_csv_row_torn_at_any_byte_is_found_and_set_aside_whole(tmp_path):
    """Cut the last row of a CSV at every byte (a kill mid-append): the reader leaves the cut row out, the writer
    moves it to results.csv.torn, and the rows before it stay, quoted newlines and all."""
    rng = random.Random(11)
    rows = [record(i, rng) for i in range(4)] + ['r9,flash,"two\nlines",1.25\r\n']
    whole = HEADER + "".join(rows[:-1])
    last = rows[-1].encode()
    for cut in range(1, len(last)):
        path = tmp_path / f"cut{cut}" / "results.csv"
        path.parent.mkdir()
        path.write_bytes(whole.encode() + last[:cut])
        good, torn = files.read_whole(path)
        assert good == whole.encode() and torn.rows == 1 and torn.nbytes == cut and torn.side is None
        assert path.read_bytes() == whole.encode() + last[:cut]  # a reader writes nothing
        moved = files.set_aside_torn(path)
        assert path.read_bytes() == whole.encode() and moved.side == path.with_name("results.csv.torn")
        assert moved.side.read_bytes().rstrip(b"\n") == last[:cut].rstrip(b"\n")
        assert "a torn row" in moved.line() and "set aside in results.csv.torn" in moved.line()
        assert files.set_aside_torn(path) is None


def test_a_row_glued_to_a_torn_one_mid_file_is_set_aside_and_the_rows_after_it_kept(tmp_path):
    """The issue's folder: a torn line, then a whole row appended straight after it (one line of too many fields),
    then more rows; the glued line goes to the side file, the rest stays, and the side file only grows."""
    path = tmp_path / "results.csv"
    glued = "r2,naive,,1.0r3,flash,,2.0\r\n".replace("1.0r3", "1.0,r3")  # 7 fields under a 4-column header
    path.write_text(HEADER + "r1,naive,,0.5\r\n" + glued + "r4,flash,,3.0\r\n", newline="")
    (tmp_path / "results.csv.torn").write_bytes(b"an earlier torn row\n")
    moved = files.set_aside_torn(path)
    assert path.read_bytes().decode() == HEADER + "r1,naive,,0.5\r\nr4,flash,,3.0\r\n"
    assert moved.rows == 1 and moved.side.read_bytes() == b"an earlier torn row\n" + glued.encode()


def test_a_torn_header_leaves_nothing_that_reads_and_the_next_append_starts_the_file_again(tmp_path):
    path = tmp_path / "results.csv"
    path.write_text(HEADER[:9])
    assert files.read_whole(path)[0] == b""
    files.set_aside_torn(path)
    files.append_row(path, "r1,naive,,0.5\r\n", header=HEADER)
    assert path.read_bytes().decode() == HEADER + "r1,naive,,0.5\r\n"


def test_json_lines_keep_the_objects_that_parse(tmp_path):
    path = tmp_path / "samples.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": 2\n[3]\n{"b": 3}\n{"c": [1, 2')
    good, torn = files.read_whole(path)
    assert good == b'{"a": 1}\n{"b": 3}\n' and torn.rows == 3


def test_a_derived_file_is_the_old_one_or_the_new_one(tmp_path, faults):
    path = tmp_path / "run.json"
    files.write_file(path, "old")
    faults("enospc:run.json")
    with pytest.raises(WriteError, match=f"cannot write {path}: No space left on device"):
        files.write_file(path, "new" * 1000)
    with pytest.raises(RuntimeError), files.replaced(path, "w") as fh:  # an error in the block
        fh.write("half")
        raise RuntimeError("boom")
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]
    faults("")
    files.write_file(path, "new")
    assert path.read_text() == "new"


def test_the_temporary_files_a_killed_writer_left_are_removed_by_the_next(tmp_path):
    left = tmp_path / ".results.parquet.4242.phasebench-tmp"
    left.write_bytes(b"half a parquet")
    (tmp_path / "results.csv").write_text(HEADER)
    files.remove_temporaries(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["results.csv"]
