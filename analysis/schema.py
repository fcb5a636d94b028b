"""Column names and dtypes of phasebench result rows and profile tables (schema version 1)."""

from __future__ import annotations

import numpy as np
import pandas as pd

SCHEMA_VERSION = 1

# One row per (case, impl), in the order the runner writes them (docs: SCHEMA.md).
RESULT_COLUMNS = (
    "run_id", "time", "device", "device_kind", "suite", "model",
    "impl", "backend", "mode", "phase",
    "batch", "q_heads", "kv_heads", "q_len", "kv_len", "head_dim", "causal", "dtype",
    "flops", "bytes", "intensity",
    "latency_ms", "latency_p20_ms", "latency_p80_ms", "samples",
    "tflops", "gbps", "peak_tflops", "peak_gbps", "roof_tflops", "pct_roofline", "bound",
    "max_rel_err", "status", "reason",
)

# Columns the loader adds after the result columns (run metadata and provenance).
RUN_COLUMNS = (
    "source",  # the file a row was read from
    "python_version", "torch_version", "triton_version", "flash_attn_version",
    "phasebench_version", "git_commit",
    "datasheet_name", "datasheet_tflops", "datasheet_gbps",
)

# The fields that identify a case (together with device and dtype when comparing impls).
CASE_FIELDS = ("phase", "batch", "q_heads", "kv_heads", "q_len", "kv_len", "head_dim", "causal")

# A results table without these cannot be analysed at all.
REQUIRED_COLUMNS = (
    "impl", "phase", "batch", "q_heads", "kv_heads", "q_len", "kv_len", "head_dim",
    "dtype", "latency_ms", "status",
)

STRING_COLUMNS = (
    "run_id", "time", "device", "device_kind", "suite", "model", "impl", "backend", "mode",
    "phase", "dtype", "bound", "status", "reason",
    "timer",  # written by the runner beside the schema columns (which clock timed the row)
    "source", "python_version", "torch_version", "triton_version", "flash_attn_version",
    "phasebench_version", "git_commit", "datasheet_name",
)
INT_COLUMNS = ("batch", "q_heads", "kv_heads", "q_len", "kv_len", "head_dim", "samples")
BOOL_COLUMNS = ("causal",)
FLOAT_COLUMNS = (
    "flops", "bytes", "intensity", "latency_ms", "latency_p20_ms", "latency_p80_ms",
    "tflops", "gbps", "peak_tflops", "peak_gbps", "roof_tflops", "pct_roofline",
    "max_rel_err", "datasheet_tflops", "datasheet_gbps",
)

PHASES = ("prefill", "chunked_prefill", "decode")
STATUSES = ("ok", "skipped", "failed", "incorrect")

# Profile summary tables (profiles/summary.py): one row per timed case key, with the case
# fields, ranges (occurrences), wall_ns, kernel_count, kernel_time_ns, launch_overhead_ns.
PROFILE_REQUIRED_COLUMNS = ("key", "kernel_count", "kernel_time_ns", "wall_ns", "launch_overhead_ns")
PROFILE_INT_COLUMNS = ("kernel_count", "ranges") + INT_COLUMNS[:-1]
PROFILE_FLOAT_COLUMNS = ("kernel_time_ns", "wall_ns", "launch_overhead_ns")

_TRUE_WORDS = {"true", "1", "yes", "t", "y", "1.0"}
_FALSE_WORDS = {"false", "0", "no", "f", "n", "0.0"}


def _as_bool(series: pd.Series, name: str) -> pd.Series:
    def convert(value):
        if value is None or (isinstance(value, float) and np.isnan(value)) or value is pd.NA:
            return pd.NA
        word = str(value).strip().lower()
        if word in _TRUE_WORDS:
            return True
        if word in _FALSE_WORDS:
            return False
        raise ValueError(f"column {name!r} holds {value!r}, not a boolean")

    return series.map(convert).astype("boolean")


def _as_int(series: pd.Series, name: str) -> pd.Series:
    numbers = _as_float(series, name)
    whole = numbers.dropna()
    if not (whole == np.round(whole)).all():
        raise ValueError(f"column {name!r} holds non-integer values")
    return numbers.astype("Int64")


def _as_float(series: pd.Series, name: str) -> pd.Series:
    try:
        return pd.to_numeric(series, errors="raise").astype(float)
    except (ValueError, TypeError) as error:
        raise ValueError(f"column {name!r} is not numeric ({error})") from None


def _as_str(series: pd.Series) -> pd.Series:
    # Missing text becomes "" (as the runner writes for an empty model or reason),
    # so groupby never silently drops rows.
    return series.astype(object).where(series.notna(), "").map(str).astype(str)


def coerce_columns(
    df: pd.DataFrame,
    *,
    strings=STRING_COLUMNS,
    ints=INT_COLUMNS,
    floats=FLOAT_COLUMNS,
    bools=BOOL_COLUMNS,
) -> pd.DataFrame:
    """Cast the known columns present in `df` to their dtypes; raises ValueError naming a bad column."""
    out = df.copy()
    for name in out.columns:
        if name in strings:
            out[name] = _as_str(out[name])
        elif name in ints:
            out[name] = _as_int(out[name], name)
        elif name in floats:
            out[name] = _as_float(out[name], name)
        elif name in bools:
            out[name] = _as_bool(out[name], name)
    return out


def conform(df: pd.DataFrame) -> pd.DataFrame:
    """Result rows with every schema and loader column, typed, in schema order (extras kept last)."""
    out = df.copy()
    for name in RESULT_COLUMNS + RUN_COLUMNS:
        if name not in out.columns:
            out[name] = "" if name in STRING_COLUMNS else np.nan
    out = coerce_columns(out)
    known = list(RESULT_COLUMNS + RUN_COLUMNS)
    extras = [name for name in out.columns if name not in known]
    return out[known + extras]
