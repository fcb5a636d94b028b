"""The one result schema: column order, types, defaults, the runner's aliases, and no torch behind it."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import phasebench.analysis as analysis
import pytest
from phasebench.bench.spec import schema
from phasebench.bench.sweep import results


def test_one_schema_for_runner_and_loader():
    assert results.COLUMNS == list(schema.RESULT_COLUMNS) == list(analysis.RESULT_COLUMNS)
    assert results.SCHEMA_VERSION == analysis.SCHEMA_VERSION == schema.SCHEMA_VERSION == 9
    assert results.CASE_COLUMNS == list(schema.CASE_COLUMNS)
    assert results.STATUSES == schema.STATUSES
    assert set(results.TEXT_COLUMNS) <= set(schema.RESULT_COLUMNS)
    assert analysis.RUN_COLUMNS == schema.RUN_COLUMNS


def test_column_order():
    cols = list(schema.RESULT_COLUMNS)
    assert len(cols) == len(set(cols))
    assert cols[cols.index("model") + 1] == "op"
    assert cols[cols.index("dtype") + 1: cols.index("dtype") + 3] == ["seqlens", "kv_tokens"]
    assert cols[cols.index("samples") + 1: cols.index("samples") + 4] == ["timer", "noisy", "noise_reason"]
    assert cols[-1] == "profiled"
    assert cols[cols.index("bound") + 1: cols.index("bound") + 3] == ["roof_model", "above_roof"]
    assert cols[cols.index("intensity") + 1: cols.index("intensity") + 3] == ["read_bytes", "write_bytes"]
    assert cols[cols.index("peak_gbps") + 1: cols.index("peak_gbps") + 3] == ["read_gbps", "write_gbps"]
    assert cols[cols.index("page_size") + 1: cols.index("page_size") + 4] == ["window_left", "sinks", "head_dim_v"]
    start = cols.index("batch")
    assert tuple(cols[start: start + len(schema.CASE_COLUMNS)]) == schema.CASE_COLUMNS


def test_every_column_has_exactly_one_type():
    typed = [schema.STRING_COLUMNS, schema.INT_COLUMNS, schema.FLOAT_COLUMNS, schema.BOOL_COLUMNS]
    for name in schema.RESULT_COLUMNS + schema.RUN_COLUMNS:
        assert sum(name in group for group in typed) == 1, name
    assert set(schema.RESULT_STRING_COLUMNS) == set(schema.STRING_COLUMNS) & set(schema.RESULT_COLUMNS)


def test_conform_fills_schema_1_rows_with_defaults():
    rng = np.random.default_rng(97)
    batch, kv_len = rng.integers(1, 9, size=5), rng.integers(3, 1025, size=5)
    old = pd.DataFrame({"impl": "flash", "phase": "decode", "batch": batch, "kv_len": kv_len,
                        "latency_ms": rng.uniform(0.1, 3.0, size=5), "status": "ok"})
    out = schema.conform(old)
    assert list(out.columns[: len(schema.RESULT_COLUMNS)]) == list(schema.RESULT_COLUMNS)
    assert out["op"].eq("attention").all() and out["seqlens"].eq("").all()
    assert out["noisy"].eq(False).all() and out["profiled"].eq(False).all()
    assert out["kv_tokens"].tolist() == (batch * kv_len).tolist()
    # before schema 5 a row's roof put all its bytes at the copy bandwidth: it says so, and has no split
    assert out["roof_model"].eq("copy").all() and out["read_bytes"].isna().all() and out["read_gbps"].isna().all()
    # before schema 7 no row had a window, sinks or a value narrower than its key
    assert out["window_left"].eq(-1).all() and out["sinks"].eq(False).all() and out["head_dim_v"].isna().all()


def test_a_row_without_a_window_or_sinks_keys_like_one_written_before_the_columns():
    old = {"op": "attention", "impl": "flash", "batch": 2, "page_size": 0}
    new = {**old, "window_left": -1, "sinks": False}
    assert schema.sample_key(old) == schema.sample_key(new)
    assert schema.sample_key({**new, "window_left": 127}) != schema.sample_key(new)
    assert schema.sample_key({**new, "sinks": True}) != schema.sample_key(new)


def test_rows_before_schema_7_were_held_to_their_own_dtype_and_newer_rows_keep_what_they_multiply_in():
    rows = pd.DataFrame({"dtype": ["bfloat16", "float16", "bfloat16"], "compute_dtype": ["", None, "float32"]})
    out = schema.conform(rows)
    assert out["compute_dtype"].tolist() == ["bfloat16", "float16", "float32"]
    assert schema.conform(rows.drop(columns="compute_dtype"))["compute_dtype"].tolist() == list(rows["dtype"])


def test_conform_keeps_what_rows_say():
    rows = pd.DataFrame({"op": ["attention", "linear"], "seqlens": ["97,1025,3", ""], "kv_tokens": [1125, np.nan],
                         "batch": [3, 5], "kv_len": [1025, 80], "noisy": ["True", ""], "profiled": [None, "1"]})
    out = schema.conform(rows)
    assert out["op"].tolist() == ["attention", "linear"]
    assert out["seqlens"].tolist() == ["97,1025,3", ""] and out["kv_tokens"].tolist() == [1125, 400]
    assert out["noisy"].tolist() == [True, False] and out["profiled"].tolist() == [False, True]


def test_bad_values_name_their_column():
    with pytest.raises(ValueError, match="column 'noisy' holds 'maybe'"):
        schema.conform(pd.DataFrame({"noisy": ["maybe"]}))
    with pytest.raises(ValueError, match="column 'kv_tokens' holds non-integer"):
        schema.conform(pd.DataFrame({"kv_tokens": [2.5]}))


def test_runner_csv_keeps_text_columns_text(tmp_path):
    row = {name: "" for name in results.COLUMNS}
    row.update(run_id="20250101", seqlens="97,1025,3", noise_reason="0.7 CPU share", op="attention", timer="x",
               batch=3, kv_len=1025, causal=False, noisy=True, profiled=False)
    path = tmp_path / "results.csv"
    pd.DataFrame([row], columns=results.COLUMNS).to_csv(path, index=False)
    df = results.read_results_csv(path)
    assert df.loc[0, "run_id"] == "20250101" and df.loc[0, "seqlens"] == "97,1025,3"
    assert df.loc[0, "noise_reason"] == "0.7 CPU share"


def test_schema_and_analysis_import_no_torch():
    script = (
        "import sys, phasebench.bench.spec.schema, phasebench.bench.spec.models, phasebench.bench.spec.steps, "
        "phasebench.analysis\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'triton')"
        " or m.startswith('phasebench.kernels')"
        " or (m.startswith('phasebench.bench.') and not m.startswith('phasebench.bench.spec'))]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True)


def test_cells_read_as_floats_and_flags_with_blanks_as_nothing():
    import math

    from phasebench.bench.spec.schema import cell_float, cell_true

    assert cell_float("1.5") == 1.5 and cell_float(2) == 2.0
    assert all(math.isnan(cell_float(v)) for v in (None, "[N/A]", "", float("nan")))
    assert not any(cell_true(v) for v in (None, pd.NA, float("nan"), 0, False, ""))  # a blank is not a yes
    assert all(cell_true(v) for v in (True, 1, 1.0, "yes"))


def test_rows_before_schema_6_read_as_unquantized():
    old = pd.DataFrame({"impl": ["torch"], "op": ["linear"], "m": [1], "n": [97], "k": [200], "dtype": ["float32"],
                        "phase": ["decode"], "latency_ms": [0.5], "status": ["ok"]})
    out = schema.conform(old)
    assert "scheme" in schema.KEY_COLUMNS and "scheme" in schema.CASE_FIELDS
    assert out.loc[0, "scheme"] == "" and out["scheme"].dtype == out["projection"].dtype


def test_rows_before_schema_7_have_no_interval_and_say_nothing_of_convergence():
    old = pd.DataFrame({"impl": ["torch"], "op": ["linear"], "m": [1], "n": [97], "k": [200], "dtype": ["float32"],
                        "phase": ["decode"], "latency_ms": [0.5], "samples": [9], "status": ["ok"]})
    out = schema.conform(old)
    assert out[["latency_ci_low_ms", "latency_ci_high_ms", "latency_ci_rel"]].isna().all().all()
    assert out["converged"].isna().all() and not schema.cell_true(out.loc[0, "converged"])  # unknown, not False
    assert out["outliers"].isna().all() and str(out["outliers"].dtype) == "Int64"
    cols = list(schema.RESULT_COLUMNS)
    at = cols.index("latency_p80_ms") + 1
    assert cols[at: at + 5] == ["latency_ci_low_ms", "latency_ci_high_ms", "latency_ci_rel", "converged", "outliers"]


def test_rows_written_before_the_stop_reason_read_as_blank_and_not_drifting():
    old = pd.DataFrame({"impl": ["torch", "naive"], "op": ["linear", "linear"], "m": [1, 3], "n": [97, 97],
                        "k": [200, 200], "dtype": ["float32"] * 2, "phase": ["decode"] * 2, "latency_ms": [0.5, 0.7],
                        "converged": [True, False], "status": ["ok"] * 2})
    out = schema.conform(old)
    assert (out["stop_reason"] == "").all() and (out["drifting"] == False).all()  # noqa: E712 (a boolean column)
    assert out[["first_half_ms", "second_half_ms", "warmup_s"]].isna().all().all()
    assert str(out["drifting"].dtype) == "boolean" and out["first_half_ms"].dtype == float
    new = schema.conform(pd.DataFrame({**{c: old[c] for c in old.columns}, "stop_reason": ["target", "drifting"],
                                       "drifting": ["False", "True"], "first_half_ms": [0.5, 0.6],
                                       "second_half_ms": [0.5, 0.8], "warmup_s": [0.2, 0.4]}))
    assert list(new["stop_reason"]) == ["target", "drifting"] and list(new["drifting"]) == [False, True]
    assert list(new["second_half_ms"]) == [0.5, 0.8] and list(new["warmup_s"]) == [0.2, 0.4]


def test_rows_before_schema_7_read_as_no_experts():
    old = pd.DataFrame({"impl": ["torch"], "op": ["linear"], "m": [1], "n": [97], "k": [200], "dtype": ["float32"],
                        "phase": ["decode"], "latency_ms": [0.5], "status": ["ok"]})
    out = schema.conform(old)
    assert {"experts", "top_k", "routing", "routing_seed"} <= set(schema.KEY_COLUMNS) & set(schema.CASE_FIELDS)
    assert out.loc[0, "routing"] == "" and pd.isna(out.loc[0, "touched_experts"])
    assert str(out["experts"].dtype) == "Int64" and out["routing"].dtype == out["projection"].dtype
