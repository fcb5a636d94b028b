"""Weight-only quantized linear layers (op qlinear) against the same projection unquantized (op linear): the speedup
per scheme and M beside the ideal that the bytes allow."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter

from ...bench.spec.roof import roof_of_row
from .kit import (
    SERIES_GID,
    draw_bars,
    floats,
    group_fields,
    groups,
    impl_colors,
    left_out_note,
    new_figure,
    no_data,
    one_group_note,
    op_rows,
    optional,
    ordered_impls,
    performance_rows,
    ratio_ends,
)

IDEAL_GID = "ideal"  # the unquantized row's time over the quantized row's roof: what a kernel at its roof would reach
SHAPE_FIELDS = ("model", "projection", "n", "k", "dtype", "m")
QUANT_COLUMNS = ("scheme", "impl", "latency_ms", "baseline_latency_ms", "speedup", "speedup_lo", "speedup_hi",
                 "roof_ms", "bound", "ideal", "ideal_lo", "ideal_hi", "pct_of_ideal", "bytes_ratio")
CAPTION = ("Speedup of each weight-only quantized implementation over the unquantized projection served by the vendor "
           "GEMM (torch, the activation dtype) at the same M, one point per projection with its 95% interval and a "
           "line through their median; the dashed line is the ideal: the unquantized row's measured time over the "
           "quantized row's roof time (its bytes read and written at the measured ceilings), drawn only up to the "
           "ridge, where the quantized row is memory-bound (past it the bytes saved buy nothing). Below the ideal "
           "the kernel pays for something else (dequantization, a copy of the weights, a slower GEMV).")


def quant_speedup_table(df: pd.DataFrame, baseline: str = "torch") -> pd.DataFrame:
    """One row per (device, mode, timer, profiled, run, model, projection, N, K, dtype, M, scheme, impl) of the
    qlinear rows whose projection also ran unquantized with `baseline` in the same run and group: the median
    latencies of both, speedup = baseline latency / latency with its 95% interval (speedup_lo, speedup_hi, from both
    sides' intervals of their medians); the quantized row's roof time on the measured ceilings (roof_ms, bench.spec.
    roof) and its bound; ideal = baseline latency / roof_ms with the baseline's interval (ideal_lo, ideal_hi), only
    where the quantized row is memory-bound (below the ridge; NaN past it) and pct_of_ideal = 100 · speedup / ideal;
    bytes_ratio = baseline bytes / bytes, for reference (no ceiling: the baseline may stand off its own roof). Only
    performance rows take part (not interpreter-mode, noisy or above their roof)."""
    # paired within one run (decode-quant measures both), never against another run's medians
    keys = group_fields(df) + [name for name in ("run_id", *SHAPE_FIELDS) if name in df.columns]
    columns = keys + list(QUANT_COLUMNS)
    rows = performance_rows(df)
    quant, dense = op_rows(rows, "qlinear"), op_rows(rows, "linear")
    dense = dense[dense["impl"] == baseline]
    if quant.empty or dense.empty:
        return pd.DataFrame(columns=columns)
    dense, quant = (part.assign(_lo=optional(part, "latency_ci_low_ms"), _hi=optional(part, "latency_ci_high_ms"))
                    for part in (dense, quant))  # over several runs of a key, the envelope of their intervals
    _, roof_s, bound, _ = roof_of_row(quant)
    quant = quant.assign(_roof_ms=np.asarray(roof_s, dtype=float) * 1e3, _bound=np.asarray(bound, dtype=object))
    base = dense.groupby(keys, dropna=False, observed=True).agg(
        baseline_latency_ms=("latency_ms", "median"), baseline_bytes=("bytes", "median"), _base_lo=("_lo", "min"),
        _base_hi=("_hi", "max")).reset_index()
    per_impl = quant.groupby(keys + ["scheme", "impl"], dropna=False, observed=True).agg(
        latency_ms=("latency_ms", "median"), bytes=("bytes", "median"), _lo=("_lo", "min"), _hi=("_hi", "max"),
        roof_ms=("_roof_ms", "median"), bound=("_bound", "first")).reset_index()
    matched = per_impl.merge(base, on=keys, how="inner")
    matched["speedup"] = matched["baseline_latency_ms"] / matched["latency_ms"]
    matched["speedup_lo"], matched["speedup_hi"] = ratio_ends(
        tuple(floats(matched[c]) for c in ("baseline_latency_ms", "_base_lo", "_base_hi")),
        tuple(floats(matched[c]) for c in ("latency_ms", "_lo", "_hi")))
    below_ridge = (matched["bound"] == "memory").to_numpy() & (floats(matched["roof_ms"]) > 0)
    for name, column in (("ideal", "baseline_latency_ms"), ("ideal_lo", "_base_lo"), ("ideal_hi", "_base_hi")):
        matched[name] = np.where(below_ridge, floats(matched[column]) / floats(matched["roof_ms"]), np.nan)
    matched["pct_of_ideal"] = 100 * matched["speedup"] / matched["ideal"]
    matched["bytes_ratio"] = matched["baseline_bytes"] / matched["bytes"]
    matched = matched[np.isfinite(matched["speedup"].to_numpy(dtype=float))]
    return matched[columns].sort_values(keys + ["scheme", "impl"], kind="stable").reset_index(drop=True)


def quant_speedup(df: pd.DataFrame, baseline: str = "torch", *, figsize=None) -> Figure:
    """Per group (rows of panels) and scheme (columns): speedup over the unquantized `baseline` against M (log-log),
    one point per projection with its speedup's 95% interval, a line through the medians per impl, and the ideal
    (the baseline's time over the quantized roof) dashed up to the ridge (gid "ideal")."""
    title = f"Weight-only quantized linear layers: speedup over the unquantized {baseline} GEMM against M"
    table = quant_speedup_table(df, baseline)
    if table.empty:
        return no_data(title, f"no qlinear row ran ok beside its projection unquantized with {baseline!r}")
    panels = groups(table)
    schemes = sorted(table["scheme"].unique())
    colors = impl_colors(table["impl"].unique())
    fig, axes = new_figure(len(panels), len(schemes), figsize=figsize)
    for row, (label, group) in enumerate(panels):
        for column, scheme in enumerate(schemes):
            ax = axes[row, column]
            _panel(ax, group[group["scheme"] == scheme], colors)
            ax.set_title(scheme if len(panels) == 1 else f"{scheme}\n{label}", fontsize="medium")
            ax.set_ylabel(f"speedup over unquantized {baseline} (×)" if column == 0 else "")
    handles = [Line2D([], [], color=colors[impl], marker="o", label=impl)
               for impl in ordered_impls(table["impl"].unique())]
    handles.append(Line2D([], [], color="0.2", linestyle="--",
                          label="ideal: unquantized time / quantized roof (to the ridge)"))
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize="small", frameon=False)
    fig.suptitle(title + one_group_note(table) + left_out_note(df))
    return fig


def _panel(ax, rows: pd.DataFrame, colors: dict) -> None:
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    for impl in ordered_impls(rows["impl"].unique()):
        mine = rows[rows["impl"] == impl]
        ax.scatter(floats(mine["m"]), floats(mine["speedup"]), color=colors[impl], s=14, alpha=0.45)
        draw_bars(ax, floats(mine["m"]), floats(mine["speedup"]), floats(mine["speedup_lo"]),
                  floats(mine["speedup_hi"]), colors[impl])
        medians = mine.assign(_m=floats(mine["m"])).groupby("_m")["speedup"].median()
        ax.plot(medians.index, medians.to_numpy(dtype=float), color=colors[impl], marker="o", gid=SERIES_GID)
    ideal = rows.assign(_m=floats(rows["m"])).groupby("_m")["ideal"].median().dropna()  # none past the ridge
    if len(ideal):
        ax.plot(ideal.index, ideal.to_numpy(dtype=float), color="0.2", linestyle="--", gid=IDEAL_GID)
    ax.axhline(1.0, color="0.5", linestyle=":", linewidth=1)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}×"))
    ax.set_xlabel("M (tokens)")
    ax.grid(True, which="major", alpha=0.3)
