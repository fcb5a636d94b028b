"""Which of chunking, protection or separation keeps the decode users above the targets, on designed tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
from phasebench.analysis.phases.remedies import options_table, remedy_lines


def designed(protected_ms=np.nan) -> dict:
    """A 1000-token prompt beside 8 users at context 512: the decode-only step 80 ms (12.5 tok/s per user)."""
    colocated = pd.DataFrame([
        {"option": "separated", "prompt": 1000, "decode_batch": 8, "context": 512, "decode_only_ms": 80.0,
         "itl_ms": 80.0, "ttft_ms": 900.0, "source": "composed: the prefill on another device"},
        {"option": "co-located", "prompt": 1000, "decode_batch": 8, "context": 512, "decode_only_ms": 80.0,
         "itl_ms": 400.0, "ttft_ms": 1800.0, "source": "fair share (composed)"},
        {"option": "protected", "prompt": 1000, "decode_batch": 8, "context": 512, "decode_only_ms": 80.0,
         "itl_ms": protected_ms, "ttft_ms": np.nan, "source": "measured: protected/priority stream on cuda:0"},
    ])
    chunked = pd.DataFrame({"chunk": [500, 125], "itl_ms": [250.0, 125.0], "ttft_ms": [500.0, 1000.0]})
    return {"colocated": colocated, "chunked": chunked}


def test_options_side_by_side_with_who_keeps_each_target():
    table = options_table(designed(protected_ms=90.0)).set_index("option")
    assert list(table.index) == ["separated", "co-located", "protected", "chunked C=125", "chunked C=500"]
    assert table["tokens_per_s_per_user"].tolist() == [12.5, 2.5, 1e3 / 90, 8.0, 4.0]
    assert table["meets_3"].tolist() == [True, False, True, True, True]
    assert table["meets_10"].tolist() == [True, False, True, False, False]
    assert table.loc["chunked C=125", "remedy"] == "chunking" and table.loc["co-located", "remedy"] == "none"


def test_lines_name_the_remedies_that_keep_the_users_above_each_target():
    lines = remedy_lines(designed(protected_ms=90.0))
    assert lines[1].startswith("The 1000-token prompt beside 8 decode users at context 512 (decode-only ITL 80 ms)")
    three = next(line for line in lines if line.startswith("3 tok/s"))
    ten = next(line for line in lines if line.startswith("10 tok/s"))
    assert "kept by separated (12.5 tok/s), protected (11.1 tok/s), chunked C=125 (8 tok/s), chunked C=500 " \
           "(4 tok/s)" in three and "co-located with no remedy misses it" in three
    assert "kept by separated (12.5 tok/s), protected (11.1 tok/s); not by chunked C=125 (8 tok/s), chunked " \
           "C=500 (4 tok/s)" in ten


def test_an_unmeasured_protection_is_said_so():
    lines = remedy_lines(designed())
    ten = next(line for line in lines if line.startswith("10 tok/s"))
    assert ten.endswith("not measured: protected") and "kept by separated (12.5 tok/s);" in ten
    assert options_table(designed())["meets_10"].isna().tolist() == [False, False, True, False, False]


def test_nothing_without_the_colocated_table():
    assert remedy_lines({"chunked": designed()["chunked"]}) == []


def test_a_composition_with_nothing_measured_says_so_for_every_option():
    tables = designed()
    tables["colocated"]["itl_ms"] = np.nan
    tables["chunked"]["itl_ms"] = np.nan
    three = next(line for line in remedy_lines(tables) if line.startswith("3 tok/s"))
    assert three == ("3 tok/s per user: kept by none; not by none; not measured: separated, co-located, protected, "
                     "chunked C=125, chunked C=500")
