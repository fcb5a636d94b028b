"""Scaling with length: prefill latency and TFLOP/s against sequence length, decode GB/s against KV length."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from .kit import (
    CEILING_GID,
    LINESTYLES,
    SERIES_GID,
    describe,
    draw_findings,
    draw_intervals,
    flag,
    floats,
    groups,
    impl_colors,
    left_out_note,
    new_figure,
    no_performance,
    op_rows,
    ordered_impls,
    series_fields,
    shown_rows,
)

# Fields that, when they vary within one impl, split its rows into separate lines
# (device, mode and timer make panels of their own).
_SPLIT_FIELDS = ("dtype", "model", "batch", "q_heads", "kv_heads", "head_dim", "causal", "page_size")


def prefill_scaling(df: pd.DataFrame, *, figsize=None) -> Figure:
    """Prefill rows: latency (log) and achieved TFLOP/s against sequence length, one line per
    impl, split (and labelled) by dtype, model or shape where those vary; one row of panels
    per (device, mode, timer) group. Interpreter-mode and noisy rows are left out (the
    title counts them); rows above their roof are hollow points, out of the lines. Attention rows only.

    Lines carry gid "series"; a point is the median of the rows at that length; each row's 95% interval
    is a bar at its own value (gid "interval").
    """
    title = "Prefill scaling with sequence length"
    df = op_rows(df, "attention")
    rows = shown_rows(df, "prefill")
    if rows.empty:
        return no_performance(title, df, "prefill")
    panels = groups(rows)
    fig, axes = new_figure(len(panels), 2, figsize=figsize or (12.0, 4.6 * len(panels)))
    for (latency_ax, tflops_ax), (label, group) in zip(axes, panels, strict=True):
        found = flag(group, "above_roof")
        for series in _series(group[~found], "q_len", ("latency_ms", "tflops"), always=()):
            style = dict(color=series["color"], linestyle=series["style"], marker="o", markersize=4,
                         label=series["label"], gid=SERIES_GID)
            latency_ax.plot(series["x"], series["latency_ms"], **style)
            tflops_ax.plot(series["x"], series["tflops"], **style)
        _findings(latency_ax, group[found], "q_len", "latency_ms")
        _findings(tflops_ax, group[found], "q_len", "tflops")
        _intervals(latency_ax, group, "q_len", "latency_ms")
        _intervals(tflops_ax, group, "q_len", "tflops")
        for ax in (latency_ax, tflops_ax):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("sequence length (q_len = kv_len)")
            ax.grid(True, alpha=0.3)
            ax.set_title(label, fontsize="medium")
        latency_ax.set_yscale("log")
        latency_ax.set_ylabel("latency (ms)")
        tflops_ax.set_ylabel("achieved TFLOP/s")
        tflops_ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small", frameon=False)
    fig.suptitle(title + left_out_note(df, "prefill"))
    return fig


def decode_scaling(df: pd.DataFrame, *, figsize=None) -> Figure:
    """Decode rows: achieved GB/s against KV length, one line per impl × batch (split further
    where dtype, model or heads vary), one panel per (device, mode, timer) group with its
    measured read ceiling dotted (decode reads; the copy lighter). Interpreter-mode and noisy rows
    are left out (the title counts them); rows above their roof are hollow points, out of the lines.
    Attention rows only.

    Data lines carry gid "series", ceiling lines gid "ceiling".
    """
    title = "Decode bandwidth with KV length"
    df = op_rows(df, "attention")
    rows = shown_rows(df, "decode")
    if rows.empty:
        return no_performance(title, df, "decode")
    panels = groups(rows)
    fig, axes = new_figure(1, len(panels), figsize=figsize or (4.5 + 4.5 * len(panels), 5.5))
    for ax, (label, in_group) in zip(axes[0], panels, strict=True):
        found = flag(in_group, "above_roof")
        for series in _series(in_group[~found], "kv_len", ("gbps",), always=("batch",)):
            ax.plot(series["x"], series["gbps"], color=series["color"], linestyle=series["style"], marker="o",
                    markersize=4, label=series["label"], gid=SERIES_GID)
        _findings(ax, in_group[found], "kv_len", "gbps")
        _intervals(ax, in_group, "kv_len", "gbps")
        for column, what, shade in (("read_gbps", "read", "0.3"), ("peak_gbps", "copy", "0.65")):
            peaks = floats(in_group[column]) if column in in_group.columns else np.array([np.nan])
            if np.isfinite(peaks).any():
                peak = float(np.nanmedian(peaks))
                ax.axhline(peak, color=shade, linestyle=":", linewidth=1.2, gid=CEILING_GID,
                           label=f"measured {what}: {peak:.4g} GB/s")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("KV length (tokens)")
        ax.set_ylabel("achieved GB/s (minimum bytes / latency)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.set_title(label, fontsize="medium")
        ax.legend(loc="best", fontsize="x-small", frameon=False)
    fig.suptitle(title + left_out_note(df, "decode"))
    return fig


def _findings(ax, rows: pd.DataFrame, x: str, metric: str) -> None:
    """The rows above their roof as hollow points in their impl's colour, each with its share of the roof."""
    colors = impl_colors(rows["impl"].unique())
    for impl, part in rows.groupby("impl", sort=False):
        draw_findings(ax, floats(part[x]), floats(part[metric]), part, color=colors[impl], size=24)


def _intervals(ax, rows: pd.DataFrame, x: str, metric: str) -> None:
    """Each row's 95% interval of its median latency, carried into `metric`, at its own point (a line is the median
    of the rows at a length)."""
    colors = impl_colors(rows["impl"].unique())
    for impl, part in rows.groupby("impl", sort=False):
        draw_intervals(ax, floats(part[x]), floats(part[metric]), part, inverse=metric != "latency_ms",
                       color=colors[impl])


def _series(rows: pd.DataFrame, x: str, metrics: tuple[str, ...], always: tuple[str, ...]) -> list[dict]:
    """One dict per line: x values, the median of each metric per x, label, colour, linestyle."""
    split = list(always) + [name for name in series_fields(rows, _SPLIT_FIELDS) if name not in always]
    colors = impl_colors(rows["impl"].unique())
    # Line style tells the non-impl variants apart; colour stays the impl's.
    variants = rows[split].drop_duplicates().sort_values(split).itertuples(index=False) if split else [()]
    style_of = {tuple(variant): LINESTYLES[index % len(LINESTYLES)] for index, variant in enumerate(variants)}
    found = []
    for impl in ordered_impls(rows["impl"].unique()):
        of_impl = rows[rows["impl"] == impl]
        groups = of_impl.groupby(split, sort=True, dropna=False) if split else [((), of_impl)]
        for key, group in groups:
            key = key if isinstance(key, tuple) else (key,)
            per_x = group.assign(_x=floats(group[x])).groupby("_x")[list(metrics)].median().sort_index()
            series = {
                "x": per_x.index.to_numpy(dtype=float),
                "label": describe({"impl": impl, **dict(zip(split, key, strict=True))}),
                "color": colors[impl],
                "style": style_of.get(tuple(key), "-"),
            }
            for metric in metrics:
                series[metric] = floats(per_x[metric])
            found.append(series)
    return found
