"""Nsight Compute's CSV (`ncu --csv --page details`, live or `--import`ed) as a tidy frame, and a digest per launch."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import pandas as pd

REQUIRED = ("Kernel Name", "Section Name", "Metric Name", "Metric Unit", "Metric Value")
COLUMNS = ("launch", "kernel", "section", "metric", "unit", "value", "text")
# seconds per unit for the time metrics ncu prints in whichever unit reads best
_TIME_UNITS = {"nsecond": 1e-9, "ns": 1e-9, "usecond": 1e-6, "us": 1e-6, "msecond": 1e-3, "ms": 1e-3,
               "second": 1.0, "s": 1.0}
# (section, metric) -> digest column; sections as ncu 2023-2025 name them in the details page
DIGEST = {
    ("GPU Speed Of Light Throughput", "Duration"): "duration_us",
    ("GPU Speed Of Light Throughput", "DRAM Throughput"): "dram_pct",
    ("GPU Speed Of Light Throughput", "Memory Throughput"): "memory_pct",
    ("GPU Speed Of Light Throughput", "Compute (SM) Throughput"): "compute_pct",
    ("Memory Workload Analysis", "Memory Throughput"): "memory_gbps",
    ("Occupancy", "Achieved Occupancy"): "achieved_occupancy_pct",
    ("Occupancy", "Theoretical Occupancy"): "theoretical_occupancy_pct",
    ("Launch Statistics", "Registers Per Thread"): "registers",
    ("Launch Statistics", "Grid Size"): "grid",
    ("Launch Statistics", "Block Size"): "block",
}


class NcuFormatError(ValueError):
    """Text that holds no ncu details table."""


def _number(text: str) -> float:
    cleaned = text.replace(",", "").strip()
    try:
        return float(cleaned)
    except ValueError:
        return math.nan


def parse_details(text: str) -> pd.DataFrame:
    """One row per (launch, section, metric): the kernel name, unit, value as a number (NaN for 'n/a' or text)
    and as printed. Lines before the CSV header (ncu's '==PROF==' messages, the program's output) are skipped."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"') and all(f'"{c}"' in line
                                                                                     for c in REQUIRED)), None)
    if start is None:
        raise NcuFormatError(f"no ncu details header (columns {', '.join(REQUIRED)})")
    reader = csv.DictReader(io.StringIO("\n".join(lines[start:])))
    rows = []
    for record in reader:
        if record.get("Kernel Name") is None or record.get("Metric Name") is None:
            continue  # a line of other output after the table
        value = record.get("Metric Value") or ""
        rows.append({"launch": record.get("ID", ""), "kernel": record["Kernel Name"],
                     "section": record["Section Name"], "metric": record["Metric Name"],
                     "unit": record.get("Metric Unit") or "", "value": _number(value), "text": value})
    return pd.DataFrame(rows, columns=list(COLUMNS))


def read_details(path: Path | str) -> pd.DataFrame:
    """parse_details of a file; a file without the table gets a one-line NcuFormatError naming it."""
    try:
        return parse_details(Path(path).read_text(errors="replace"))
    except NcuFormatError as err:
        raise NcuFormatError(f"{path}: {err}") from None


def digest(details: pd.DataFrame) -> pd.DataFrame:
    """One row per launch: kernel name, duration in microseconds, the DRAM, memory and compute throughputs (%
    of peak), the memory GB/s, the occupancies, registers per thread and launch shape, where ncu measured them."""
    out = []
    for (launch, kernel), group in details.groupby(["launch", "kernel"], sort=False):
        row = {"launch": launch, "kernel": kernel}
        for rec in group.to_dict("records"):
            column = DIGEST.get((rec["section"], rec["metric"]))
            if column is None:
                continue
            if column == "duration_us":
                row[column] = rec["value"] * _TIME_UNITS.get(rec["unit"], math.nan) * 1e6
            elif column == "memory_gbps":
                row[column] = _gbps(rec["value"], rec["unit"])
            elif column in ("grid", "block"):
                row[column] = rec["text"]
            else:
                row[column] = rec["value"]
        out.append(row)
    return pd.DataFrame(out, columns=["launch", "kernel", *dict.fromkeys(DIGEST.values())])


def _gbps(value: float, unit: str) -> float:
    prefix = {"": 1e-9, "K": 1e-6, "M": 1e-3, "G": 1.0, "T": 1e3}
    head, sep, per = unit.partition("byte/")  # ncu writes Gbyte/second in older releases, Gbyte/s in 2024+
    if not sep or per not in ("s", "second") or head not in prefix:
        return math.nan
    return value * prefix[head]
