"""Every point drawn from a row's latency carries the row's 95% interval: the bars at the interval's ends (TFLOP/s and
the other inverse figures flip them), speedups from both rows' intervals, none for files without intervals, and the
summary's count of rows that stopped short of their target."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import LineCollection
from phasebench.analysis import (
    decode_kinds_roofline,
    decode_kinds_table,
    phase_comparison,
    prefill_scaling,
    roofline,
    speedup,
    speedup_table,
    summary_table,
)
from phasebench.analysis.figures.kit import INTERVAL_GID
from phasebench.bench.spec.interval import ratio_interval
from phasebench.bench.spec.schema import conform

from .test_decode_kinds_plots import kinds_frame


def with_intervals(rows: pd.DataFrame, rng) -> pd.DataFrame:
    """Rows with uneven intervals around their medians (below by 1-6%, above by 2-9%) and a converged flag."""
    out = rows.copy()
    latency = out["latency_ms"].to_numpy(dtype=float)
    out["latency_ci_low_ms"] = latency * (1 - rng.uniform(0.01, 0.06, len(out)))
    out["latency_ci_high_ms"] = latency * (1 + rng.uniform(0.02, 0.09, len(out)))
    out["latency_ci_rel"] = (out["latency_ci_high_ms"] - out["latency_ci_low_ms"]) / 2 / latency
    out["converged"] = out["latency_ci_rel"] <= 0.04
    return conform(out)


@pytest.fixture
def frame(rows, rng) -> pd.DataFrame:
    return with_intervals(rows, rng)


def bars(fig) -> list[np.ndarray]:
    """The (x, low, high) of every interval bar in the figure."""
    found = []
    for ax in fig.axes:
        for collection in ax.collections:
            if isinstance(collection, LineCollection) and collection.get_gid() == INTERVAL_GID:
                found += [(seg[0, 0], seg[0, 1], seg[1, 1]) for seg in collection.get_segments()]
    return found


def test_the_roofline_bars_are_each_rows_tflops_at_its_intervals_ends(frame):
    fig = roofline(frame)
    shown = frame[(frame["status"] == "ok") & (frame["mode"] == "compiled")]
    expected = sorted((x, t * m / hi, t * m / lo) for x, t, m, lo, hi in zip(
        shown["intensity"], shown["tflops"], shown["latency_ms"], shown["latency_ci_low_ms"],
        shown["latency_ci_high_ms"], strict=True))
    assert np.allclose(sorted(bars(fig)), expected, rtol=1e-9)


def test_latency_bars_are_the_interval_itself_and_shares_of_the_roof_flip_it(frame):
    fig = phase_comparison(frame)
    found = bars(fig)
    attention = frame[(frame["status"] == "ok") & (frame["op"] == "attention")]
    lows = {round(low, 9) for _, low, _ in found}
    assert {round(v, 9) for v in attention["latency_ci_low_ms"]} <= lows  # the latency panels: the interval as is
    pct_low = attention["pct_roofline"] * attention["latency_ms"] / attention["latency_ci_high_ms"]
    assert {round(v, 9) for v in pct_low} <= lows  # the % of roof panels: the high latency gives the low share
    assert len(found) == 2 * len(attention)


def test_scaling_draws_each_rows_interval_at_its_own_value(frame):
    fig = prefill_scaling(frame)
    prefill = frame[(frame["status"] == "ok") & (frame["phase"] == "prefill") & (frame["op"] == "attention")]
    found = bars(fig)
    assert len(found) == 2 * len(prefill)
    assert {round(v, 9) for v in prefill["latency_ci_high_ms"]} <= {round(high, 9) for _, _, high in found}


def test_a_speedup_carries_the_interval_of_the_two_rows_ratio(frame):
    table = speedup_table(frame, "naive")
    assert len(table) and table["speedup_lo"].notna().all()
    keyed = frame[frame["status"] == "ok"].set_index(["impl", "phase", "batch", "q_len", "kv_len"])
    for row in table.itertuples(index=False):
        mine = keyed.loc[(row.impl, row.phase, row.batch, row.q_len, row.kv_len)]
        base = keyed.loc[("naive", row.phase, row.batch, row.q_len, row.kv_len)]
        sides = [(side["latency_ms"], side["latency_ci_low_ms"], side["latency_ci_high_ms"]) for side in (base, mine)]
        assert (row.speedup, row.speedup_lo, row.speedup_hi) == pytest.approx(ratio_interval(*sides))
        assert row.speedup_lo < row.speedup < row.speedup_hi
    assert len(bars(speedup(frame, "naive"))) == len(table)


def test_rows_of_files_without_intervals_draw_no_bars(rows):
    old = conform(rows)
    assert not bars(roofline(old)) and not bars(phase_comparison(old))
    assert speedup_table(old, "naive")["speedup_lo"].isna().all()


def test_the_summary_counts_rows_that_stopped_short_of_their_target(frame):
    table = summary_table(frame)
    ok = frame[(frame["status"] == "ok") & (frame["mode"] == "compiled")]
    assert table["unconverged"].sum() == int((~ok["converged"].astype(bool)).sum())
    for row in table.itertuples(index=False):
        group = ok[(ok["op"] == row.op) & (ok["phase"] == row.phase) & (ok["impl"] == row.impl)]
        assert row.median_ci_pct == pytest.approx(100 * group["latency_ci_rel"].median())


def test_the_decode_kinds_roofline_bars_each_row_at_its_intervals_ends(rng):
    frame = with_intervals(kinds_frame(rng), rng)
    shown = decode_kinds_table(frame)
    expected = sorted((x, t * m / hi, t * m / lo) for x, t, m, lo, hi in zip(
        shown["intensity"], shown["tflops"], shown["latency_ms"], shown["latency_ci_low_ms"],
        shown["latency_ci_high_ms"], strict=True))
    assert len(expected) == 6 and np.allclose(sorted(bars(decode_kinds_roofline(frame))), expected, rtol=1e-9)
