"""Speedup of each implementation over a baseline implementation on identical cases, within one group."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from ...bench.spec.schema import CASE_FIELDS
from .kit import (
    GROUP_FIELDS,
    categories,
    draw_bars,
    draw_findings,
    flag,
    floats,
    impl_colors,
    left_out_note,
    new_figure,
    no_data,
    one_group_note,
    optional,
    ordered_impls,
    ordered_ops,
    ordered_phases,
    ratio_ends,
    shown_rows,
    spread,
)

# A pair is the same case, dtype and group (device, mode, timer, profiled): an interpreter
# row and a compiled one, or a CUDA-event and a host-clock timing, never pair.
MATCH_FIELDS = CASE_FIELDS + ("dtype",) + GROUP_FIELDS


def speedup_table(df: pd.DataFrame, baseline: str = "naive") -> pd.DataFrame:
    """One row per (case, dtype, device, mode, timer, profiled, impl) that the baseline also
    ran ok in the same group: the median latencies of both (over runs) and speedup =
    baseline latency / impl latency with its 95% interval (speedup_lo, speedup_hi: the two sides'
    intervals of their medians, bench.spec.interval.ratio_interval; over several runs of a key, the
    envelope of their intervals; NaN where a side has none); `above_roof` where a row of either side
    stood above its roof (a finding: the figure draws it hollow, out of the median). Interpreter-mode
    and noisy rows take no part."""
    keys = [name for name in MATCH_FIELDS if name in df.columns]
    columns = keys + ["impl", "latency_ms", "baseline_latency_ms", "speedup", "speedup_lo", "speedup_hi",
                      "above_roof"]
    rows = shown_rows(df)
    if rows.empty:
        return pd.DataFrame(columns=columns)
    rows = rows.assign(above_roof=flag(rows, "above_roof"), _lo=optional(rows, "latency_ci_low_ms"),
                       _hi=optional(rows, "latency_ci_high_ms"))
    per_impl = rows.groupby(keys + ["impl"], dropna=False, observed=True).agg(
        latency_ms=("latency_ms", "median"), _lo=("_lo", "min"), _hi=("_hi", "max"),
        above_roof=("above_roof", "any")).reset_index()
    base = per_impl[per_impl["impl"] == baseline].drop(columns="impl")
    base = base.rename(columns={"latency_ms": "baseline_latency_ms", "above_roof": "_base_above", "_lo": "_base_lo",
                                "_hi": "_base_hi"})
    others = per_impl[per_impl["impl"] != baseline]
    matched = others.merge(base, on=keys, how="inner")
    matched["speedup"] = matched["baseline_latency_ms"] / matched["latency_ms"]
    matched["speedup_lo"], matched["speedup_hi"] = ratio_ends(
        tuple(floats(matched[c]) for c in ("baseline_latency_ms", "_base_lo", "_base_hi")),
        tuple(floats(matched[c]) for c in ("latency_ms", "_lo", "_hi")))
    matched["above_roof"] = matched["above_roof"].astype(bool) | matched["_base_above"].astype(bool)
    matched = matched[np.isfinite(matched["speedup"].to_numpy(dtype=float))]
    return matched[columns].reset_index(drop=True)


def speedup(df: pd.DataFrame, baseline: str = "naive", *, figsize=None) -> Figure:
    """Per operator and phase: the speedup of every other impl over `baseline` (log scale;
    1 = as fast).

    Cases match on the operator, the case fields (linear: m, n, k, projection), dtype,
    device, mode and timer; one point per matched case, the bar is the median (also written
    as text), a point's bar the 95% interval of its speedup; a pair with a row above its roof is
    hollow and out of the median. Labels name the
    group where the frame holds several; panel titles name the operator where the frame holds
    several.
    """
    title = f"Speedup over {baseline} (same case, dtype, device, mode and timer)"
    table = speedup_table(df, baseline)
    if table.empty:
        return no_data(title, f"no case ran ok with both {baseline!r} and another impl in one group")
    table = table.assign(category=categories(table))
    if "op" not in table.columns:
        table["op"] = "attention"
    ops = ordered_ops(table["op"].unique())
    panels = [(op, phase) for op in ops
              for phase in ordered_phases(table.loc[table["op"] == op, "phase"].unique())]
    colors = impl_colors(table["impl"].unique())
    fig, axes = new_figure(1, len(panels), figsize=figsize)
    for column, (op, phase) in enumerate(panels):
        ax = axes[0, column]
        in_phase = table[(table["op"] == op) & (table["phase"] == phase)]
        rank = {impl: index for index, impl in enumerate(ordered_impls(in_phase["impl"].unique()))}
        order = sorted(
            in_phase[["category", "impl"]].drop_duplicates().itertuples(index=False),
            key=lambda pair: (rank[pair.impl], pair.category),
        )
        for position, (category, impl) in enumerate(order):
            strip = in_phase[in_phase["category"] == category]
            found = strip["above_roof"].to_numpy(dtype=bool)
            values, xs = floats(strip["speedup"]), position + spread(len(strip))
            ax.scatter(xs[~found], values[~found], color=colors[impl], s=22, alpha=0.8, zorder=3)
            draw_findings(ax, xs[found], values[found], None, color=colors[impl], size=22)  # a ratio of two rows
            draw_bars(ax, xs, values, floats(strip["speedup_lo"]), floats(strip["speedup_hi"]), colors[impl])
            if (~found).any():
                median = np.nanmedian(values[~found])
                ax.hlines(median, position - 0.32, position + 0.32, color=colors[impl], linewidth=2.2)
                ax.annotate(f"{median:.3g}×", (position + 0.34, median), va="center", fontsize="x-small")
        ax.axhline(1.0, color="0.4", linestyle=":", linewidth=1)
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}×"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks(range(len(order)), [pair.category for pair in order], rotation=30, ha="right")
        ax.set_xlim(-0.6, len(order) - 0.1)
        ax.set_xlabel("implementation")
        ax.set_ylabel(f"speedup over {baseline} (×)")
        ax.set_title(phase if len(ops) == 1 else f"{op} · {phase}")
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(title + one_group_note(table) + left_out_note(df))
    return fig

