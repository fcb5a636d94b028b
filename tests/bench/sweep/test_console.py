"""The closing table and lines of a run: a drifting row marked and counted with its halves, apart from the rows that
stopped short of their target; the rows judged at a farther cache level's figure named."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
from phasebench.bench.spec import schema
from phasebench.bench.sweep.console import Progress, closing_lines, format_table


def _rows(seed: int = 41) -> pd.DataFrame:
    """Three compiled ok rows as a run writes them: one stopped on its target, one at its time limit short of it, one
    drifting (its second half 1.5x slower)."""
    rng = np.random.default_rng(seed)
    latency = rng.uniform(0.2, 3.0, 3)
    rows = []
    for i, (reason, rel) in enumerate((("target", 0.013), ("time limit", 0.047), ("drifting", 0.115))):
        first = latency[i] * (0.8 if reason == "drifting" else 1.0)
        second = first * (1.5 if reason == "drifting" else 1.0)
        rows.append({"op": "attention", "impl": f"impl{i}", "phase": "decode", "shape": f"b1 h8/2 q{i + 1} k257",
                     "dtype": "float32", "mode": "compiled", "status": "ok", "reason": "", "latency_ms": latency[i],
                     "latency_ci_low_ms": latency[i] * (1 - rel), "latency_ci_high_ms": latency[i] * (1 + rel),
                     "latency_ci_rel": rel, "converged": reason == "target", "stop_reason": reason,
                     "drifting": reason == "drifting", "first_half_ms": first, "second_half_ms": second,
                     "warmup_s": 0.4, "samples": 97, "batch": 1, "q_heads": 8, "kv_heads": 2, "q_len": i + 1,
                     "kv_len": 257, "head_dim": 64})
    return schema.conform(pd.DataFrame(rows))


def test_a_drifting_row_is_marked_in_the_table_and_counted_with_its_halves(tmp_path):
    df = _rows()
    table = format_table(df).splitlines()
    assert "DRIFTING" in table[3] and not any("DRIFTING" in line for line in table[:3])
    lines = closing_lines(df, tmp_path)
    drifting = [line for line in lines if "were drifting" in line]
    drifted = df.iloc[2]
    assert len(drifting) == 1 and drifting[0].startswith("warning: 1 of 3 timed rows were drifting")
    assert f"impl2 {drifted['shape']}: {drifted['first_half_ms']:.3f} ms then {drifted['second_half_ms']:.3f} ms" \
        in drifting[0]
    short = [line for line in lines if "wider than its target" in line]  # the drifting row is not counted twice
    assert len(short) == 1 and short[0].startswith("note: 1 of 3 timed rows stopped at their time or sample limit")
    assert "±4.7%, impl1" in short[0]


def test_rows_of_files_before_the_stop_reason_raise_no_drift_warning(tmp_path):
    df = _rows().drop(columns=["stop_reason", "drifting", "first_half_ms", "second_half_ms", "warmup_s"])
    assert "DRIFTING" not in format_table(df)
    assert not any("were drifting" in line for line in closing_lines(df, tmp_path))
    assert any("note: 2 of 3 timed rows stopped" in line for line in closing_lines(df, tmp_path))


def test_the_progress_line_says_drifting():
    stream = io.StringIO()
    row = _rows().iloc[2].to_dict()
    Progress(stream)(row, 3, 3)
    assert stream.getvalue().rstrip().endswith("DRIFTING")


def level_rows(notes) -> pd.DataFrame:
    rng = np.random.default_rng(53)
    return schema.conform(pd.DataFrame([
        {"impl": "torch", "phase": "decode", "op": "elementwise", "status": "ok", "mode": "compiled",
         "latency_ms": rng.uniform(0.01, 0.1), "pct_roofline": rng.uniform(40.0, 95.0), "noisy": False,
         "roof_level": level, "level_note": note, "cache_state": "warm" if level != "memory" else "rotated"}
        for level, note in notes]))


def test_the_closing_lines_name_the_rows_judged_at_a_farther_levels_figure(tmp_path):
    """Three warm rows in the L2 judged at the LLC's read (their L2's own below it) and one in the LLC at its own: one
    warning for the three, naming the figure that judged them and the level's own; none without such rows."""
    note = "read at the llc's 172.5 GB/s (the l2's own 84.2)"
    df = level_rows([("l2", note)] * 3 + [("llc", ""), ("memory", "")])
    found = [line for line in closing_lines(df, tmp_path) if "farther level" in line]
    assert found == [f"warning: 3 warm rows read from the l2 are judged at a farther level's figure, the l2's own "
                     f"measured below it: {note}"]
    quiet = level_rows([("l2", ""), ("llc", ""), ("memory", "")])
    assert not [line for line in closing_lines(quiet, tmp_path) if "farther level" in line]


def test_an_interval_reads_as_a_percentage_while_narrow_and_as_a_factor_when_wide():
    from phasebench.bench.sweep.console import spread_text

    assert spread_text(0.99, 1.01, 1.0) == "±1.0%" and spread_text(0.9, 1.1, 1.0) == "±10.0%"
    assert spread_text(1 / 1.18, 1.18, 1.0) == "±18.0%"  # the longer arm of a log-symmetric interval
    assert spread_text(1.352, 138.4, 13.68) == "×/÷10"  # the allocator's two regimes: 4.7 and 24 ms rounds
    assert spread_text(2.136, 3.700, 2.811) == "×/÷1.3"
    assert spread_text(float("nan"), 1.0, 1.0) == "" and spread_text(None, None, 1.0) == ""
