"""Result rows and their store: one CSV line per row as soon as it exists, parquet and run.json beside it."""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

import pandas as pd

SCHEMA_VERSION = 1
CASE_COLUMNS = ["batch", "q_heads", "kv_heads", "q_len", "kv_len", "head_dim", "causal", "dtype"]
COLUMNS = [
    "run_id", "time", "device", "device_kind", "suite", "model",
    "impl", "backend", "mode", "phase", *CASE_COLUMNS,
    "flops", "bytes", "intensity",
    "latency_ms", "latency_p20_ms", "latency_p80_ms", "samples", "timer",
    "tflops", "gbps", "peak_tflops", "peak_gbps", "roof_tflops", "pct_roofline", "bound",
    "max_rel_err", "status", "reason",
]
STATUSES = ("ok", "skipped", "failed", "incorrect")


def row_key(row: dict) -> tuple:
    """What identifies a measurement for --resume: the impl and the case."""
    return (str(row["impl"]), str(row.get("model", "")), *(str(row[c]) for c in CASE_COLUMNS))


class ResultsStore:
    """Appends rows to DIR/results.csv (flushed and synced per row) and writes parquet and run.json."""

    def __init__(self, out_dir: Path, resume: bool = False):
        self.out_dir = Path(out_dir)
        self.csv_path = self.out_dir / "results.csv"
        self.parquet_path = self.out_dir / "results.parquet"
        self.run_json_path = self.out_dir / "run.json"
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if not os.access(self.out_dir, os.W_OK):
            raise PermissionError(f"out: {self.out_dir} is not writable")
        self.done: set[tuple] = set()
        if resume and self.csv_path.exists():
            with self.csv_path.open(newline="") as fh:
                self.done = {row_key(r) for r in csv.DictReader(fh)}
        elif self.csv_path.exists():
            self.csv_path.unlink()
            self.parquet_path.unlink(missing_ok=True)

    def previous_run(self) -> dict | None:
        try:
            return json.loads(self.run_json_path.read_text())
        except (OSError, ValueError):
            return None

    def write_run(self, meta: dict) -> None:
        tmp = self.run_json_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"schema": SCHEMA_VERSION, **meta}, indent=1, default=str))
        tmp.replace(self.run_json_path)

    def is_done(self, row_like: dict) -> bool:
        return row_key(row_like) in self.done

    def append(self, row: dict) -> None:
        new_file = not self.csv_path.exists()
        with self.csv_path.open("a", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=COLUMNS, extrasaction="ignore")
            if new_file:
                writer.writeheader()
            writer.writerow({k: _csv_value(row.get(k)) for k in COLUMNS})
            fh.flush()
            os.fsync(fh.fileno())
        self.done.add(row_key(row))

    def frame(self) -> pd.DataFrame:
        if not self.csv_path.exists():
            return pd.DataFrame(columns=COLUMNS)
        return read_results_csv(self.csv_path)

    def write_parquet(self) -> pd.DataFrame:
        df = self.frame()
        df.to_parquet(self.parquet_path, index=False)
        return df


def _csv_value(value):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return value


TEXT_COLUMNS = ("run_id", "time", "device", "device_kind", "suite", "model", "impl", "backend", "mode", "phase",
                "dtype", "timer", "bound", "status", "reason")


def read_results_csv(path: Path) -> pd.DataFrame:
    df = pd.read_csv(path, keep_default_na=False, na_values=[""], dtype={c: str for c in TEXT_COLUMNS})
    for col in TEXT_COLUMNS:
        if col in df:
            df[col] = df[col].fillna("")
    if "causal" in df:
        df["causal"] = df["causal"].astype(str).str.lower().isin(["true", "1"])
    return df
