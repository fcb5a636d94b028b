"""The report's tables: summary, status, correctness, problems, runs and the lists of flagged rows."""

from __future__ import annotations

import pandas as pd

from ...bench.spec.schema import STATUSES, cell_true
from ..figures.kit import (
    GROUP_FIELDS,
    finding_rows,
    flag,
    interpreter,
    ok_rows,
    optional,
    ordered_impls,
    ordered_ops,
    ordered_phases,
    performance_rows,
)

SUMMARY_COLUMNS = (
    "ok", "noisy", "above_roof", "unconverged", "median_ci_pct", "best_pct_roofline", "median_pct_roofline",
    "median_tflops", "median_gbps", "max_pct_above_roof",
)
SUMMARY_BY = GROUP_FIELDS + ("op", "phase", "impl")
STATUS_BY = ("device", "mode", "op", "phase", "impl")
CORRECTNESS_COLUMNS = ("device", "impl", "case", "max_rel_err", "status")
FLAGGED_COLUMNS = ("device", "mode", "impl", "case", "latency_ms", "pct_roofline", "why")


def sort_rows(table: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Operators, phases and impls in their usual order rather than alphabetical."""
    keys = {}
    if "op" in by:
        keys["op"] = {name: index for index, name in enumerate(ordered_ops(table["op"].unique()))}
    if "phase" in by:
        keys["phase"] = {name: index for index, name in enumerate(ordered_phases(table["phase"].unique()))}
    if "impl" in by:
        keys["impl"] = {name: index for index, name in enumerate(ordered_impls(table["impl"].unique()))}
    return table.sort_values(
        by, key=lambda column: column.map(keys[column.name]) if column.name in keys else column
    ).reset_index(drop=True)


def summary_table(df: pd.DataFrame, by=SUMMARY_BY) -> pd.DataFrame:
    """Per group of ok rows (device, mode, timer, profiled, op, phase and impl by default): the
    ok count, how many of them are noisy, how many quiet ones stand above their roof and how many
    stopped sampling short of their interval's target (unconverged), the median half-width of their
    95% intervals in % of their medians, best and median pct_roofline, median TFLOP/s and GB/s over
    the ok rows that are neither noisy nor above their roof, and the highest % of roof among those
    above it (findings: marked here, never in a median). Interpreter-mode rows are not performance and
    never enter it (see correctness_table)."""
    by = [name for name in by if name in df.columns]
    ok = ok_rows(df)
    ok = ok[~interpreter(ok)]
    if ok.empty:
        return pd.DataFrame(columns=by + list(SUMMARY_COLUMNS))
    clean = performance_rows(ok).groupby(by, dropna=False, observed=True)
    table = pd.DataFrame({"ok": ok.groupby(by, dropna=False, observed=True).size()})
    keys = [ok[name] for name in by]
    table["noisy"] = flag(ok, "noisy").groupby(keys, dropna=False, observed=True).sum()
    above = (flag(ok, "above_roof") & ~flag(ok, "noisy"))
    table["above_roof"] = above.groupby(keys, dropna=False, observed=True).sum()
    unconverged = ~ok["converged"].astype("boolean").fillna(True) if "converged" in ok else flag(ok, "_none")
    table["unconverged"] = unconverged.groupby(keys, dropna=False, observed=True).sum()
    table["median_ci_pct"] = 100 * pd.Series(optional(ok, "latency_ci_rel"), index=ok.index).groupby(
        keys, dropna=False, observed=True).median()
    table["best_pct_roofline"] = clean["pct_roofline"].max()
    table["median_pct_roofline"] = clean["pct_roofline"].median()
    table["median_tflops"] = clean["tflops"].median()
    table["median_gbps"] = clean["gbps"].median()
    table["max_pct_above_roof"] = finding_rows(ok).groupby(by, dropna=False, observed=True)["pct_roofline"].max()
    table["noisy"] = table["noisy"].fillna(0).astype(int)
    table["above_roof"] = table["above_roof"].fillna(0).astype(int)
    table["unconverged"] = table["unconverged"].fillna(0).astype(int)
    return sort_rows(table.reset_index(), by)


def case_text(row: dict) -> str:
    """A row's case in words: its operator and phase, then the runner's shape label (or the fields of an
    older file that has none), then dtype."""
    op = row.get("op") or "attention"
    if row.get("shape"):
        return f"{op} {row['phase']} {row['shape']} {row['dtype']}"
    if op in ("linear", "qlinear"):
        scheme = f"{row.get('scheme')} " if op == "qlinear" else ""
        return f"{op} {row['phase']} {row.get('projection') or ''} m{row['m']} n{row['n']} k{row['k']} " \
               f"{scheme}{row['dtype']}".replace("  ", " ")
    text = (f"{op} {row['phase']} b{row['batch']} hq{row['q_heads']} "
            f"hkv{row['kv_heads']} q{row['q_len']} k{row['kv_len']} d{row['head_dim']} {row['dtype']}")
    if row.get("causal") is True:
        text += " causal"
    if row.get("seqlens"):
        text += f" seqlens={row['seqlens']}"
    return text


def _with_case(rows: pd.DataFrame) -> pd.DataFrame:
    order = [name for name in ("device", "op", "phase", "impl", "batch", "q_len", "kv_len", "m") if name in rows]
    rows = sort_rows(rows, order)
    return rows.assign(case=[case_text(row) for row in rows.to_dict("records")])


def correctness_table(df: pd.DataFrame) -> pd.DataFrame:
    """The interpreter-mode rows (Triton without a GPU): what they prove is correctness, so
    per row the device, impl, case, max_rel_err against the reference and status."""
    rows = df[interpreter(df)]
    if rows.empty:
        return pd.DataFrame(columns=list(CORRECTNESS_COLUMNS))
    return _with_case(rows)[list(CORRECTNESS_COLUMNS)]


def noisy_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The ok rows timed on a contended device (left out of the figures and medians), with the reason."""
    rows = ok_rows(df)
    rows = rows[flag(rows, "noisy") & ~interpreter(rows)]
    return _flagged(rows, rows["noise_reason"] if "noise_reason" in rows else "")


def above_roof_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The ok rows above their measured roof (findings, never results), with the finding."""
    rows = finding_rows(df)
    return _flagged(rows, rows["reason"] if "reason" in rows else "")


CEILING_COLUMNS = ("device", "run_id", "compute_dtype", "read_gbps", "write_gbps", "copy_gbps", "peak_tflops", "rows",
                   "copy_roof_rows")


def ceilings_table(df: pd.DataFrame) -> pd.DataFrame:
    """The ceilings the rows were judged against, per device, run and the precision their kernels multiply in
    (compute_dtype, whose matmul TFLOP/s is peak_tflops): read-only, write-only and copy GB/s (medians of the rows'
    read_gbps, write_gbps and peak_gbps), the matmul TFLOP/s, the rows, and how many of them have the copy roof (a
    file before schema 5, or an operator whose cost model gives no read/write split)."""
    rows = df[~interpreter(df)] if len(df) else df
    if rows.empty or "peak_gbps" not in rows.columns:
        return pd.DataFrame(columns=list(CEILING_COLUMNS))
    copied = rows["roof_model"] == "copy" if "roof_model" in rows.columns else pd.Series(True, index=rows.index)
    rows = rows.assign(copy_gbps=rows["peak_gbps"], _copy=copied)
    if "compute_dtype" not in rows.columns:  # a frame not conformed: each row held to its own dtype's ceiling
        rows["compute_dtype"] = rows["dtype"]
    for name in ("read_gbps", "write_gbps"):
        if name not in rows.columns:
            rows[name] = float("nan")
    table = rows.groupby(["device", "run_id", "compute_dtype"], dropna=False, sort=True).agg(
        read_gbps=("read_gbps", "median"), write_gbps=("write_gbps", "median"), copy_gbps=("copy_gbps", "median"),
        peak_tflops=("peak_tflops", "median"), rows=("status", "size"), copy_roof_rows=("_copy", "sum"))
    table = table.reset_index()
    table["copy_roof_rows"] = table["copy_roof_rows"].astype(int)
    return table[list(CEILING_COLUMNS)]


def _flagged(rows: pd.DataFrame, why) -> pd.DataFrame:
    if rows.empty:
        return pd.DataFrame(columns=list(FLAGGED_COLUMNS))
    return _with_case(rows.assign(why=why))[list(FLAGGED_COLUMNS)]


def not_ok_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Every row whose status is not ok, one per row: its status and the reason."""
    rows = df[df["status"] != "ok"]
    columns = ["device", "mode", "impl", "case", "status", "reason"]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    return _with_case(rows)[columns]


def status_table(df: pd.DataFrame, by=STATUS_BY) -> pd.DataFrame:
    """Per group: how many rows are ok, skipped, failed and incorrect (and any other status)."""
    by = [name for name in by if name in df.columns]
    statuses = list(STATUSES) + sorted(set(df["status"]) - set(STATUSES)) if not df.empty else list(STATUSES)
    if df.empty:
        return pd.DataFrame(columns=by + statuses + ["total"])
    counts = df.groupby(by + ["status"], dropna=False, observed=True).size().unstack("status", fill_value=0)
    counts = counts.reindex(columns=statuses, fill_value=0)
    counts.columns.name = None
    counts["total"] = counts.sum(axis=1)
    return sort_rows(counts.reset_index(), by)


def profiled(df: pd.DataFrame) -> pd.Series:
    """Rows measured under a profiler (`phasebench profile`): their timings carry its overhead."""
    return flag(df, "profiled")


def report_rows(df: pd.DataFrame, *, include_profiled: bool = False) -> pd.DataFrame:
    """The rows a report is made of: all of them, less the profiled ones unless asked for."""
    return df if include_profiled else df[~profiled(df)]


def problems_table(df: pd.DataFrame, limit: int = 40) -> pd.DataFrame:
    """The reasons rows are not ok, most frequent first."""
    by = [name for name in ("status", "op", "impl", "phase", "reason") if name in df.columns]
    columns = by + ["rows"]
    bad = df[df["status"] != "ok"]
    if bad.empty:
        return pd.DataFrame(columns=columns)
    counts = bad.groupby(by, dropna=False).size().rename("rows")
    return counts.reset_index().sort_values("rows", ascending=False, kind="stable").head(limit)[columns]


def runs_table(df: pd.DataFrame) -> pd.DataFrame:
    """One line per (run_id, device): kind, row counts, earliest row time, versions, profiled or not."""
    columns = ["run_id", "device", "device_kind", "rows", "ok", "first_row", "torch_version", "triton_version",
               "profiled"]
    if df.empty:
        return pd.DataFrame(columns=columns)
    grouped = df.groupby(["run_id", "device"], dropna=False, sort=True)
    table = grouped.agg(
        device_kind=("device_kind", "first"),
        rows=("status", "size"),
        ok=("status", lambda status: int((status == "ok").sum())),
        first_row=("time", "min"),
        torch_version=("torch_version", "first"),
        triton_version=("triton_version", "first"),
    )
    table["profiled"] = profiled(df).groupby([df["run_id"], df["device"]], dropna=False).any()
    table["profiled"] = table["profiled"].map(cell_true)
    return table.reset_index()[columns]
