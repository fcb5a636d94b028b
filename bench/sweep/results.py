"""Result rows and their store: one CSV line per row as soon as it exists, parquet and run.json beside it."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pandas as pd

from ..spec import schema
from ..spec.store import folder_lock
from ..spec.store.files import WriteError, append_row, note, read_whole, replaced, set_aside_torn, write_file

SCHEMA_VERSION = schema.SCHEMA_VERSION
CASE_COLUMNS = list(schema.CASE_COLUMNS)
COLUMNS = list(schema.RESULT_COLUMNS)
STATUSES = schema.STATUSES
TEXT_COLUMNS = schema.RESULT_STRING_COLUMNS
SAMPLES = schema.SAMPLES_COLUMN


KEY_COLUMNS = schema.KEY_COLUMNS
sample_key, read_samples = schema.sample_key, schema.read_samples
RETRIED = ("failed", "skipped")


class ResumeError(ValueError):
    """A --resume that would mix unlike measurements in one folder (one line)."""


def row_key(row: dict) -> tuple:
    """What identifies a measurement for --resume."""
    return tuple(str(row.get(c, "")) for c in KEY_COLUMNS)


class ResultsStore:
    """Appends rows to DIR/results.csv (one write per row, synced) and writes parquet and run.json.

    An ok row's raw samples go to DIR/samples.jsonl (one synced line per row, before its CSV line) and
    join the CSV rows in results.parquet's `samples_ms` column, so a killed run loses none of them.
    The store holds DIR (bench.spec.store.folder_lock) until `close`: a second writer is refused. A row that a kill or a
    full disk cut short is set aside in NAME.torn when the folder is opened again (bench.spec.store.files), and the
    derived files (results.parquet, run.json) are renamed into place whole; results.parquet goes when rows are added
    to a folder, and comes back at the end of the run.

    `options` are the run's measurement options (device, timer, mode); a resume whose options differ
    from those in DIR/run.json is refused. `sweep` names what the folder holds (run.json's `selection`: suite,
    dtypes, models, impls): one folder
    holds one sweep, so a resume with another suite, dtype or model is refused too (other impls of the same cases,
    fewer or more, resume). `retry_failed` measures failed and skipped rows again: each stays in the folder until
    the row that replaces it is written, so an interrupted retry loses none.
    """

    def __init__(self, out_dir: Path, resume: bool = False, retry_failed: bool = False, options: dict | None = None,
                 sweep: dict | None = None):
        self.out_dir = Path(out_dir)
        self.csv_path = self.out_dir / "results.csv"
        self.parquet_path = self.out_dir / "results.parquet"
        self.run_json_path = self.out_dir / "run.json"
        self.samples_path = self.out_dir / "samples.jsonl"
        self.unwritten: WriteError | None = None  # what write_parquet(quiet=True) could not write
        folder_lock.acquire(self.out_dir)
        self.held = True
        try:
            self._open(resume, retry_failed, options, sweep)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Let go of the folder, so that another writer may take it (once: a second close does nothing)."""
        if self.held:
            self.held = False
            folder_lock.release(self.out_dir)

    def _open(self, resume: bool, retry_failed: bool, options: dict | None, sweep: dict | None) -> None:
        self.done: set[tuple] = set()
        self.retrying: set[tuple] = set()  # keys of failed or skipped rows that the next row of the key replaces
        if resume and self.csv_path.exists():
            self._check_options(options)
            self._check_sweep(sweep)
            for path in (self.csv_path, self.samples_path):
                torn = set_aside_torn(path)
                if torn:
                    note(torn.line())
            self.parquet_path.unlink(missing_ok=True)  # the rows about to be added would make it stale
            rows = self._read_rows()
            measured = {row_key(r) for r in rows if r.get("status") not in RETRIED}
            if retry_failed:
                # a failed row whose replacement was written before a kill could drop it goes now
                kept = [r for r in rows if r.get("status") not in RETRIED or row_key(r) not in measured]
                if len(kept) != len(rows):
                    self._rewrite(kept)
                self.retrying = {row_key(r) for r in kept} - measured
                rows = [r for r in kept if row_key(r) in measured]
            self.done = {row_key(r) for r in rows}
        else:
            self._keep_earlier_rows()

    def _keep_earlier_rows(self) -> None:
        """A run without --resume starts the folder afresh, but rows an earlier run measured there are kept beside
        it (results.csv.earlier-N, samples.jsonl.earlier-N; names no loader reads) and said in one line: a user who
        forgot --resume after a kill loses nothing."""
        self.parquet_path.unlink(missing_ok=True)  # derived from results.csv, kept below
        held = self.csv_path.exists() and b"\n" in self.csv_path.read_bytes().rstrip(b"\n")  # past its header
        if not held:
            self.csv_path.unlink(missing_ok=True)
            self.samples_path.unlink(missing_ok=True)
            return
        n = 1 + sum(1 for _ in self.out_dir.glob("results.csv.earlier-*"))
        for path in (self.csv_path, self.samples_path):
            if path.exists():
                path.rename(path.with_name(f"{path.name}.earlier-{n}"))
        note(f"{self.out_dir}: rows of an earlier run (not --resume) kept as results.csv.earlier-{n}; this run "
             "starts the folder afresh")

    def _check_options(self, options: dict | None) -> None:
        previous = (self.previous_run() or {}).get("measurement")
        if options is None or previous is None:
            return
        for name in sorted(set(options) | set(previous)):
            if options.get(name) != previous.get(name):
                raise ResumeError(f"resume: {self.out_dir} was measured with {name}={previous.get(name)!r}, "
                                  f"this run has {name}={options.get(name)!r}; use another --out")

    def _check_sweep(self, sweep: dict | None) -> None:
        previous = (self.previous_run() or {}).get("selection")
        if sweep is None or previous is None:
            return
        for name in ("suite", "dtypes", "models"):
            if sweep.get(name) != previous.get(name):
                raise ResumeError(f"resume: {self.out_dir} holds a sweep of {name} {_listed(previous.get(name))}, "
                                  f"this run has {_listed(sweep.get(name))}; one folder holds one sweep, use another "
                                  "--out")

    def _read_rows(self) -> list[dict]:
        if not self._has_rows():
            return []
        with self.csv_path.open(newline="") as fh:
            reader = csv.DictReader(fh)
            if reader.fieldnames != COLUMNS:
                raise ResumeError(f"resume: {self.csv_path} has other columns than this phasebench writes "
                                  f"(schema {SCHEMA_VERSION}); use another --out")
            return list(reader)

    def _rewrite(self, rows: list[dict]) -> None:
        with replaced(self.csv_path, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(rows)

    def previous_run(self) -> dict | None:
        try:
            return json.loads(self.run_json_path.read_text())
        except (OSError, ValueError):
            return None

    def write_run(self, meta: dict, quiet: bool = False) -> None:
        """run.json, renamed into place whole; `quiet`: a write that fails is let go (the run already fails)."""
        try:
            write_file(self.run_json_path, json.dumps({"schema": SCHEMA_VERSION, **meta}, indent=1, default=str))
        except WriteError:
            if not quiet:
                raise

    def is_done(self, row_like: dict) -> bool:
        return row_key(row_like) in self.done

    def append(self, row: dict) -> None:
        """Write `row`; one that retries a failed or skipped row takes its place (see `replace`), unless it measured
        nothing (`refused`: a time budget's refusal), which leaves that row as it was."""
        if row_key(row) in self.retrying:
            if row.get("refused"):
                return
            self.retrying.discard(row_key(row))
            self.replace(row)
            return
        self._append(row)

    def _append(self, row: dict) -> None:
        if row.get(SAMPLES):
            entry = {"key": dict(zip(KEY_COLUMNS, sample_key(row), strict=True)),
                     SAMPLES: [float(v) for v in row[SAMPLES]]}
            append_row(self.samples_path, json.dumps(entry) + "\n")
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        header = text.getvalue()
        writer.writerow({k: _csv_value(row.get(k)) for k in COLUMNS})
        append_row(self.csv_path, text.getvalue()[len(header):], header=header)
        self.done.add(row_key(row))

    def replace(self, row: dict) -> None:
        """`row` in place of the row of the same measurement (row_key): `row` appended first (its samples' later
        line wins in samples.jsonl), then the CSV rewritten without the earlier row, so that a kill in between
        leaves both rows, never neither."""
        key = row_key(row)
        self._append(row)
        rows = self._read_rows()
        last = max((i for i, r in enumerate(rows) if row_key(r) == key), default=len(rows) - 1)
        self._rewrite([r for i, r in enumerate(rows) if row_key(r) != key or i == last])

    def reorder(self, keys: list[tuple]) -> None:
        """The CSV rewritten once with its rows in the order of `keys` (row_key; a key not there keeps its place
        after them): a run in rounds replaces each row as its rounds come, and ends in the order of its plan."""
        if not self.csv_path.exists():
            return
        rank = {key: i for i, key in reversed(list(enumerate(keys)))}
        rows = self._read_rows()
        ordered = sorted(range(len(rows)), key=lambda i: (rank.get(row_key(rows[i]), len(rank)), i))
        if ordered != list(range(len(rows))):
            self._rewrite([rows[i] for i in ordered])

    def rewrite_rows(self, change) -> int:
        """Every stored row passed through `change` (a CSV row's text in; the same dict back where it keeps it, else
        a new row) and the CSV rewritten once; returns how many rows changed."""
        if not self.csv_path.exists():
            return 0
        rows = self._read_rows()
        new = [change(r) for r in rows]
        count = sum(n is not r for n, r in zip(new, rows, strict=True))  # `change` returns a row it keeps as it was
        if count:
            self._rewrite([{k: _csv_value(v) for k, v in n.items() if k in COLUMNS} for n in new])
        return count

    def _has_rows(self) -> bool:
        return self.csv_path.is_file() and self.csv_path.stat().st_size > 0

    def frame(self) -> pd.DataFrame:
        if not self._has_rows():
            return pd.DataFrame(columns=COLUMNS)
        return read_results_csv(self.csv_path)

    def write_parquet(self, quiet: bool = False) -> pd.DataFrame:
        """results.parquet (renamed into place whole): the CSV rows plus their samples_ms (None where a row has none);
        returns the CSV rows. `quiet`: a write that fails is kept in `unwritten` instead of raised (the CSV holds the
        rows)."""
        df = self.frame()
        table = df.copy()
        samples = read_samples(self.samples_path)
        # keys from the CSV's own text, line by line: the frame's dtypes would blur blanks and bools
        keys = [sample_key(r) for r in self._read_rows()]
        values = [samples.get(k) for k in keys] if len(keys) == len(table) else [None] * len(table)
        table[SAMPLES] = pd.Series(values, index=table.index, dtype=object)
        self.unwritten = None
        try:
            with replaced(self.parquet_path, "wb") as fh:
                table.to_parquet(fh, index=False)
        except WriteError as err:
            if not quiet:
                raise
            self.unwritten = err
        return df


def _listed(value) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) if v != "" else "(none)" for v in value) or "(none)"
    return str(value)


def _csv_value(value):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return value


def read_results_csv(path: Path) -> pd.DataFrame:
    """The whole rows of a results.csv as the runner wrote them (a row torn by a kill is left out)."""
    whole, _ = read_whole(path)
    df = pd.read_csv(io.BytesIO(whole), keep_default_na=False, na_values=[""], dtype={c: str for c in TEXT_COLUMNS})
    for col in TEXT_COLUMNS:
        if col in df:
            df[col] = df[col].fillna("")
    for col in schema.BOOL_COLUMNS:
        if col in df:
            df[col] = df[col].astype(str).str.lower().isin(["true", "1"])
    return df
