"""The interference rows' schema: every column typed and in order, blanks where a row failed, bad cells named."""

from __future__ import annotations

import pandas as pd
import pytest
from phasebench.bench.spec.interference_schema import INTERFERENCE_COLUMNS, conform_interference


def test_a_failed_row_gets_every_column_typed_and_blank():
    rows = pd.DataFrame([{"batch": "3", "context": 97, "prompt": 1025.0, "mode": "protected", "mechanism": "disjoint "
                          "cores", "status": "failed", "reason": "the prefill process died", "extra": 1}])
    out = conform_interference(rows)
    assert list(out.columns) == [*INTERFERENCE_COLUMNS, "extra"]
    assert out["batch"].dtype == "Int64" and out["prompt"].iloc[0] == 1025
    assert out["decode_ms"].isna().all() and out["noisy"].tolist() == [False] and out["model"].tolist() == [""]


@pytest.mark.parametrize("column, value, says", [
    ("mode", "beside", "'beside', not one of alone, colocated, protected"),
    ("batch", "1.5", "column 'batch' holds non-integer values"),
    ("covered", "maybe", "column 'covered' is not numeric"),
])
def test_a_bad_cell_is_named(column, value, says):
    row = {"batch": 1, "context": 8, "prompt": 16, "mode": "alone", "mechanism": "alone", "status": "ok",
           column: value}
    with pytest.raises(ValueError, match=says):
        conform_interference(pd.DataFrame([row]))


def test_schema_1s_covered_flag_reads_as_an_unknown_share():
    # schema 1 wrote `covered` as a flag that was true on every path: it says nothing about the share
    old = pd.DataFrame([{"batch": 1, "context": 8, "prompt": 16, "mode": "colocated", "mechanism": "process",
                         "status": "ok", "covered": flag} for flag in (True, "False")])
    assert conform_interference(old)["covered"].isna().all()
    new = pd.DataFrame([{"batch": 1, "context": 8, "prompt": 16, "mode": "colocated", "mechanism": "process",
                         "status": "ok", "covered": share} for share in ("0.9987", 0.5)])
    assert conform_interference(new)["covered"].tolist() == [0.9987, 0.5]
