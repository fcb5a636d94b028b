"""Prefill against decode: latency and % of roofline per impl, and prompt vs generated tokens/s."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .kit import (
    categories,
    draw_findings,
    draw_intervals,
    flag,
    floats,
    impl_colors,
    left_out_note,
    new_figure,
    no_data,
    no_performance,
    ok_rows,
    one_group_note,
    op_rows,
    ordered_impls,
    ordered_phases,
    shown_rows,
    spread,
)

_METRICS = (("latency_ms", "latency (ms)", "log"), ("pct_roofline", "% of measured roofline", "linear"))


def phase_comparison(df: pd.DataFrame, *, figsize=None) -> Figure:
    """Per phase (columns): latency and pct_roofline (rows) as strips of the ok rows per impl.

    Each row is one point with the 95% interval of its median latency (carried into % of roof); the
    short bar is the median. Device, mode, timer and dtype join
    the impl label when the frame holds several, so no strip pools unlike rows.
    Interpreter-mode and noisy rows are left out (the title counts them); rows above their roof
    are drawn hollow and labelled, out of the median. Attention rows only: other operators' rows
    are ignored.
    """
    title = "Prefill vs decode by implementation (attention)"
    df = op_rows(df, "attention")
    rows = shown_rows(df)
    if rows.empty:
        return no_performance(title, df)
    rows = rows.assign(category=categories(rows))
    phases = ordered_phases(rows["phase"].unique())
    colors = impl_colors(rows["impl"].unique())
    fig, axes = new_figure(len(_METRICS), len(phases), figsize=figsize)
    for column, phase in enumerate(phases):
        in_phase = rows[rows["phase"] == phase]
        order = _category_order(in_phase)
        for row, (metric, label, scale) in enumerate(_METRICS):
            ax = axes[row, column]
            for position, (category, impl) in enumerate(order):
                strip = in_phase[in_phase["category"] == category]
                found = flag(strip, "above_roof").to_numpy()
                values, xs = floats(strip[metric]), position + spread(len(strip))
                ax.scatter(xs[~found], values[~found], color=colors[impl], s=22, alpha=0.8, zorder=3)
                draw_findings(ax, xs[found], values[found], strip[found], color=colors[impl], size=22)
                draw_intervals(ax, xs, values, strip, inverse=metric != "latency_ms", color=colors[impl])
                if np.isfinite(values[~found]).any():
                    ax.hlines(np.nanmedian(values[~found]), position - 0.32, position + 0.32, color=colors[impl],
                              linewidth=2.2)
            if metric == "pct_roofline":
                ax.axhline(100, color="0.5", linestyle=":", linewidth=1)
            ax.set_yscale(scale)
            ax.set_ylabel(label)
            ax.set_xticks(range(len(order)), [category for category, _ in order], rotation=30, ha="right")
            ax.set_xlim(-0.6, len(order) - 0.4)
            ax.grid(True, axis="y", alpha=0.3)
            ax.set_xlabel("implementation")
            if row == 0:
                ax.set_title(phase)
    fig.suptitle(title + one_group_note(rows) + left_out_note(df))
    return fig


def tokens_per_second(df: pd.DataFrame, model: str | None = None, *, figsize=None) -> Figure:
    """Prompt tokens/s (prefill: batch*q_len/latency) next to generated tokens/s (decode:
    batch/latency, one new token per sequence) per impl, one panel per model preset.

    Bars are medians over the preset's cases, dots the individual rows; the label over a
    pair is the prefill/decode ratio. Attention kernel only, one layer. `model` picks one
    preset; rows with no preset (hand-given shapes) form their own panel. Bars are per impl
    and (where several) device, mode, timer and dtype; interpreter-mode and noisy rows are
    left out (the title counts them); rows above their roof are hollow dots, out of the bars.
    Other operators' rows are ignored.
    """
    title = "Prompt vs generated tokens/s (attention, one layer)"
    df = op_rows(df, "attention")
    if model is not None:
        df = df[df["model"] == model]
        title += f" · {model}"
    df = df[df["phase"].isin(["prefill", "decode"])]
    rows = shown_rows(df)
    if rows.empty:
        if not ok_rows(df).empty:
            return no_performance(title, df)
        why = f"no ok prefill/decode rows for model {model!r}" if model is not None else "no ok prefill/decode rows"
        return no_data(title, why)
    seconds = floats(rows["latency_ms"]) / 1e3
    tokens = np.where(rows["phase"] == "prefill", floats(rows["batch"]) * floats(rows["q_len"]), floats(rows["batch"]))
    rows = rows.assign(tokens_per_s=tokens / seconds)

    models = sorted(rows["model"].unique(), key=lambda name: (name == "", name))
    ncols = min(len(models), 3)
    nrows = math.ceil(len(models) / ncols)
    fig, axes = new_figure(nrows, ncols, figsize=figsize)
    colors = impl_colors(rows["impl"].unique())
    for index, name in enumerate(models):
        ax = axes[index // ncols, index % ncols]
        _tokens_panel(ax, rows[rows["model"] == name], colors)
        ax.set_title(name or "(no preset)")
    for index in range(len(models), nrows * ncols):
        axes[index // ncols, index % ncols].set_axis_off()
    legend = [
        Patch(facecolor="0.55", label="prompt tokens/s (prefill)"),
        Patch(facecolor="0.85", edgecolor="0.3", hatch="//", label="generated tokens/s (decode)"),
    ]
    fig.legend(handles=legend, loc="outside lower center", ncols=2, frameon=False, fontsize="small")
    fig.suptitle(title + one_group_note(rows) + left_out_note(df))
    return fig


def _tokens_panel(ax, rows: pd.DataFrame, colors: dict) -> None:
    rows = rows.assign(category=categories(rows))
    order = _category_order(rows)
    for position, (category, impl) in enumerate(order):
        medians = {}
        for phase, offset, style in (("prefill", -0.2, {}), ("decode", 0.2, {"hatch": "//", "alpha": 0.45})):
            dots = rows[(rows["category"] == category) & (rows["phase"] == phase)]
            found = flag(dots, "above_roof").to_numpy()
            values, xs = floats(dots["tokens_per_s"]), position + offset + spread(len(dots), 0.25)
            draw_findings(ax, xs[found], values[found], dots[found], size=9)
            draw_intervals(ax, xs, values, dots, inverse=True, color="0.15")
            if not (~found).any():
                continue
            medians[phase] = np.nanmedian(values[~found])
            ax.bar(position + offset, medians[phase], width=0.36, color=colors[impl], edgecolor="0.3", **style)
            ax.scatter(xs[~found], values[~found], color="0.15", s=9, zorder=3)
        if len(medians) == 2 and medians["decode"] > 0:
            ratio = medians["prefill"] / medians["decode"]
            ax.annotate(f"{ratio:.3g}×", (position, max(medians.values())), textcoords="offset points",
                        xytext=(0, 4), ha="center", fontsize="x-small")
    ax.set_yscale("log")
    ax.set_ylabel("tokens/s")
    ax.set_xlabel("implementation")
    ax.set_xticks(range(len(order)), [category for category, _ in order], rotation=30, ha="right")
    ax.grid(True, axis="y", alpha=0.3)


def _category_order(rows: pd.DataFrame) -> list[tuple[str, str]]:
    """(category label, impl) pairs in impl order, then label order."""
    rank = {impl: index for index, impl in enumerate(ordered_impls(rows["impl"].unique()))}
    pairs = rows[["category", "impl"]].drop_duplicates().itertuples(index=False)
    return sorted(((category, impl) for category, impl in pairs), key=lambda pair: (rank[pair[1]], pair[0]))
