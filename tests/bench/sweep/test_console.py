"""The closing lines of a run: what they say of rows judged at a farther cache level's figure."""

from __future__ import annotations

import numpy as np
import pandas as pd
from phasebench.bench.spec import schema
from phasebench.bench.sweep.console import closing_lines


def rows(notes) -> pd.DataFrame:
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
    df = rows([("l2", note)] * 3 + [("llc", ""), ("memory", "")])
    found = [line for line in closing_lines(df, tmp_path) if "farther level" in line]
    assert found == [f"warning: 3 warm rows read from the l2 are judged at a farther level's figure, the l2's own "
                     f"measured below it: {note}"]
    quiet = rows([("l2", ""), ("llc", ""), ("memory", "")])
    assert not [line for line in closing_lines(quiet, tmp_path) if "farther level" in line]
