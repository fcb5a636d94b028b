"""pytest-benchmark JSON as runner rows: extra_info and stats per benchmark, the figures it did not carry derived."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ...bench.spec.roof import pct_of_roof, roof_of_row
from ...bench.spec.schema import cell_float


def is_pytest_benchmark(path: Path) -> bool:
    """A pytest-benchmark JSON with at least one benchmark of this suite (an entry whose extra_info names an impl):
    a folder may hold unrelated or broken JSON, other suites' benchmarks included; only named files must parse."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return False
    if not isinstance(data, dict) or "machine_info" not in data or not isinstance(data.get("benchmarks"), list):
        return False
    return any(isinstance(b, dict) and isinstance(b.get("extra_info"), dict) and "impl" in b["extra_info"]
               for b in data["benchmarks"])


def _object(value) -> dict:
    return value if isinstance(value, dict) else {}


def benchmark_rows(path: Path) -> pd.DataFrame:
    """One row per phasebench benchmark: its extra_info, the median and quartiles of its stats in ms, and the
    run fields pytest-benchmark knows (machine, commit, time); a one-line ValueError for another file."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except ValueError as error:
        raise ValueError(f"not valid JSON ({error})") from None
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        raise ValueError("not a pytest-benchmark file (no 'benchmarks' list)")
    machine, commit = _object(data.get("machine_info")), _object(data.get("commit_info"))
    stamp = str(data.get("datetime") or path.stem)
    cpu = _object(machine.get("cpu")).get("brand_raw") or machine.get("processor") or machine.get("node") or ""
    rows = []
    for index, bench in enumerate(data["benchmarks"]):
        extra = _object(bench.get("extra_info")) if isinstance(bench, dict) else {}
        if "impl" not in extra:
            continue  # not a benchmark of this suite
        stats = bench.get("stats")
        if not isinstance(stats, dict) or "median" not in stats:
            raise ValueError(f"benchmark {index} ({bench.get('name', '?')}) has no stats.median")
        row = dict(extra)
        row.update(
            latency_ms=cell_float(stats.get("median")) * 1e3,
            # pytest-benchmark keeps quartiles, not p20/p80: these two columns hold q1 and q3 here.
            latency_p20_ms=cell_float(stats.get("q1")) * 1e3,
            latency_p80_ms=cell_float(stats.get("q3")) * 1e3,
            samples=stats.get("rounds"),
            status=extra.get("status", "ok"),
            reason=extra.get("reason", ""),
            benchmark=bench.get("fullname") or bench.get("name", ""),
        )
        row.setdefault("timer", f"pytest-benchmark {_object(bench.get('options')).get('timer', 'host clock')}")
        row.setdefault("run_id", f"pytest-benchmark:{stamp}")
        row.setdefault("time", stamp)
        row.setdefault("device", cpu)
        row.setdefault("device_kind", "cpu" if "device" not in extra else "")
        row.setdefault("suite", bench.get("group") or "pytest-benchmark")
        row.setdefault("python_version", machine.get("python_version", ""))
        row.setdefault("git_commit", commit.get("id", ""))
        rows.append(row)
    if not rows:
        raise ValueError("no phasebench benchmarks in it (no entry has extra_info.impl)")
    return pd.DataFrame(rows)


def derive_figures(table: pd.DataFrame) -> None:
    """Fill the figures extra_info did not carry from the cost model columns and the median; the roof from the
    read and write bytes where they are known, else all the bytes at the copy bandwidth (bench.spec.roof)."""
    seconds = table["latency_ms"] / 1e3
    table["intensity"] = table["intensity"].fillna(table["flops"] / table["bytes"])
    table["tflops"] = table["tflops"].fillna(table["flops"] / seconds / 1e12)
    table["gbps"] = table["gbps"].fillna(table["bytes"] / seconds / 1e9)
    roof_tflops, roof_s, bound, model = roof_of_row(table)
    blank = table["roof_tflops"].isna().to_numpy()
    table["roof_tflops"] = table["roof_tflops"].fillna(pd.Series(roof_tflops, index=table.index))
    table["pct_roofline"] = table["pct_roofline"].fillna(pd.Series(pct_of_roof(roof_s, table["latency_ms"]),
                                                                   index=table.index))
    table["bound"] = table["bound"].where(table["bound"] != "", pd.Series(bound, index=table.index))
    table.loc[blank, "roof_model"] = model[blank]  # a roof derived here says how
