"""Routed experts (op moe) against the batch: the experts a step touches beside the coverage expected under uniform
routing, E·(1 - (1 - k/E)^B), the bytes a step reads and its latency, and its share of the read roof."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter

from ...bench.spec.routing import expected_touched
from .kit import (
    SERIES_GID,
    draw_findings,
    draw_intervals,
    finding_handle,
    flag,
    floats,
    group_fields,
    groups,
    impl_colors,
    interpreter,
    left_out_note,
    new_figure,
    no_data,
    ok_rows,
    one_group_note,
    op_rows,
    ordered_impls,
)

EXPECTED_GID = "expected"  # the uniform-routing coverage curve
LAYER_FIELDS = ("model", "experts", "top_k", "n", "k", "dtype", "phase")
COVERAGE_COLUMNS = ("routing", "m", "impl", "touched_experts", "expected_touched", "coverage_pct", "read_bytes",
                    "read_bytes_per_token", "latency_ms", "latency_ci_low_ms", "latency_ci_high_ms", "pct_roofline",
                    "timed_rows", "above_roof")
ROUTING_STYLES = {"uniform": "-", "balanced": ":"}  # zipf-S: dashed
CAPTION = ("Per mixture-of-experts layer and M tokens: left, the experts the step touches (markers, per routing) "
           "beside E·(1 - (1 - k/E)^M) expected under uniform routing (dashed) and E (dotted); middle, the bytes the "
           "step reads (the touched experts' weights, x and the routing; grey, left axis) and each implementation's "
           "median latency with the 95% interval of that median (right axis); right, the share of the row's roof "
           "with that interval (decode: its read bytes at the measured read bandwidth, its output at the write "
           "bandwidth; a compute-bound row: the matmul ceiling of its arithmetic); hollow, a row above its roof (a "
           "finding). Until every expert is touched a larger batch reads more weights; only then does batching "
           "amortize them.")


def moe_coverage_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (group, layer, routing, M, impl) of the ok moe rows: the experts touched (the case's, in every
    row) against the uniform expectation, the read bytes (per step and per token), and the median latency, its
    95% interval (the widest of the rows' ends) and % of roof over the performance rows only (NaN where none:
    interpreter-mode or noisy); `above_roof` where one of them stands above its roof (a finding, drawn hollow)."""
    rows = op_rows(ok_rows(df), "moe")
    state = ["cache_state"] if "cache_state" in rows.columns else []
    keys = group_fields(rows) + [f for f in LAYER_FIELDS if f in rows.columns] + state + ["routing", "m", "impl"]
    columns = keys[:-3] + list(COVERAGE_COLUMNS)
    if rows.empty:
        return pd.DataFrame(columns=columns)
    timed = ~interpreter(rows) & ~flag(rows, "noisy")
    figures = ("latency_ms", "latency_ci_low_ms", "latency_ci_high_ms", "pct_roofline")
    rows = rows.assign(timed_rows=timed.astype(int), above_roof=flag(rows, "above_roof") & timed,
                       **{f: rows[f].where(timed) for f in figures})
    table = rows.groupby(keys, dropna=False, observed=True).agg(
        touched_experts=("touched_experts", "first"), read_bytes=("read_bytes", "median"),
        timed_rows=("timed_rows", "sum"), above_roof=("above_roof", "any"), latency_ms=("latency_ms", "median"),
        latency_ci_low_ms=("latency_ci_low_ms", "min"), latency_ci_high_ms=("latency_ci_high_ms", "max"),
        pct_roofline=("pct_roofline", "median")).reset_index()
    table["expected_touched"] = expected_touched(floats(table["experts"]), floats(table["top_k"]), floats(table["m"]))
    table["coverage_pct"] = 100 * floats(table["touched_experts"]) / floats(table["experts"])
    table["read_bytes_per_token"] = floats(table["read_bytes"]) / floats(table["m"])
    return table[columns].sort_values(keys, kind="stable").reset_index(drop=True)


def all_touched_batch(table: pd.DataFrame) -> dict[tuple, int | None]:
    """Per (layer, routing) of a coverage table: the smallest M measured whose step touches every expert."""
    out = {}
    for key, rows in table.groupby(["model", "routing"], sort=True):
        every = rows[floats(rows["touched_experts"]) >= floats(rows["experts"])]
        out[key] = int(every["m"].min()) if len(every) else None
    return out


def _style(routing: str) -> str:
    return ROUTING_STYLES.get(routing, "--")


def moe_coverage(df: pd.DataFrame, *, figsize=None) -> Figure:
    """Per group and layer (rows of panels): experts touched, bytes and latency, and % of the read roof against M;
    the groups with timed rows only, where any has them."""
    title = "Routed experts: what a step reads as the batch grows"
    table = moe_coverage_table(df)
    if table.empty:
        return no_data(title, "no moe row ran ok")
    layers = [(label, layer) for label, group in groups(table)
              for _, layer in group.groupby([f for f in LAYER_FIELDS if f in group.columns], sort=True, dropna=False)]
    timed = [(label, layer) for label, layer in layers if layer["timed_rows"].sum() > 0]
    layers = timed or layers  # a group of interpreter-mode or noisy rows only repeats another's coverage
    colors = impl_colors(table["impl"].unique())
    fig, axes = new_figure(len(layers), 3, figsize=figsize)
    for row, (label, layer) in enumerate(layers):
        first = layer.iloc[0]
        name = (f"{first['model']} · E {int(first['experts'])} top {int(first['top_k'])} · N {int(first['n'])} "
                f"K {int(first['k'])} · {first['dtype']} {first['phase']}")
        _coverage_panel(axes[row, 0], layer)
        _bytes_panel(axes[row, 1], layer, colors)
        _roof_panel(axes[row, 2], layer, colors)
        axes[row, 0].set_title(name if len(layers) == 1 or len(groups(table)) == 1 else f"{name}\n{label}",
                               fontsize="medium", loc="left")
    handles = [Line2D([], [], color=colors[impl], marker="o", label=impl)
               for impl in ordered_impls(table["impl"].unique())]
    handles += [Line2D([], [], color="0.3", linestyle=_style(r), label=f"routing {r}")
                for r in sorted(table["routing"].unique())]
    handles.append(Line2D([], [], color="0.5", linestyle="--", label="expected touched, uniform"))
    if table["above_roof"].any():
        handles.append(finding_handle())
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 6), fontsize="small",
               frameon=False)
    fig.suptitle(title + one_group_note(table) + left_out_note(op_rows(df, "moe")))
    return fig


def _log2_x(ax, values) -> None:
    ax.set_xscale("log", base=2)
    values = np.asarray(values, dtype=float)
    if np.isfinite(values).any():  # the same span on every panel, drawn or empty
        ax.set_xlim(np.nanmin(values) / 1.25, np.nanmax(values) * 1.25)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.set_xlabel("M (tokens in the step)")
    ax.grid(True, which="major", alpha=0.3)


def _per_routing(layer: pd.DataFrame):
    for routing, rows in layer.groupby("routing", sort=True):
        yield routing, rows.drop_duplicates("m").sort_values("m")


def _coverage_panel(ax, layer: pd.DataFrame) -> None:
    experts, top_k = float(layer["experts"].iloc[0]), float(layer["top_k"].iloc[0])
    for routing, rows in _per_routing(layer):
        ax.plot(floats(rows["m"]), floats(rows["touched_experts"]), color="0.2", marker="o", linestyle=_style(routing),
                gid=SERIES_GID, label=routing)
    ms = floats(layer["m"])
    curve = np.geomspace(max(ms.min(), 1), ms.max(), 64)
    ax.plot(curve, expected_touched(experts, top_k, curve), color="0.5", linestyle="--", gid=EXPECTED_GID)
    ax.axhline(experts, color="0.5", linestyle=":", linewidth=1)
    _log2_x(ax, ms)
    ax.set_ylabel("experts touched")


def _bytes_panel(ax, layer: pd.DataFrame, colors: dict) -> None:
    for routing, rows in _per_routing(layer):
        ax.plot(floats(rows["m"]), floats(rows["read_bytes"]) / 1e6, color="0.75", linewidth=3,
                linestyle=_style(routing))
    ax.set_ylabel("MB read per step (grey)")
    _log2_x(ax, floats(layer["m"]))
    right = ax.twinx()
    for (impl, routing), rows in layer.groupby(["impl", "routing"], sort=True):
        rows = rows[np.isfinite(floats(rows["latency_ms"]))].sort_values("m")
        if rows.empty:
            continue
        mid = floats(rows["latency_ms"])
        spread = [mid - floats(rows["latency_ci_low_ms"]), floats(rows["latency_ci_high_ms"]) - mid]
        right.errorbar(floats(rows["m"]), mid, yerr=spread, color=colors[impl], marker="o", markersize=3,
                       linestyle=_style(routing), capsize=2, gid=SERIES_GID)
    if right.lines or right.collections:
        right.set_yscale("log")
    else:
        _untimed(ax)
    right.set_ylabel("latency (ms), 95% CI")


def _roof_panel(ax, layer: pd.DataFrame, colors: dict) -> None:
    for (impl, routing), rows in layer.groupby(["impl", "routing"], sort=True):
        rows = rows[np.isfinite(floats(rows["pct_roofline"]))].sort_values("m")
        above = rows["above_roof"].astype(bool).to_numpy()
        within = rows[~above]
        if not within.empty:
            ms, pct = floats(within["m"]), floats(within["pct_roofline"])
            ax.plot(ms, pct, color=colors[impl], marker="o", linestyle=_style(routing), gid=SERIES_GID)
            draw_intervals(ax, ms, pct, within, inverse=True, color=colors[impl])
        if above.any():
            draw_findings(ax, floats(rows["m"][above]), floats(rows["pct_roofline"][above]), rows[above],
                          color=colors[impl])
    if not (ax.lines or ax.collections):
        _untimed(ax)
    ax.axhline(100, color="0.5", linestyle=":", linewidth=1)
    _log2_x(ax, floats(layer["m"]))
    ax.set_ylabel("% of roof (read floor, or compute), 95% CI")


def _untimed(ax) -> None:
    ax.text(0.5, 0.5, "no timed rows here\n(interpreter-mode or noisy)", ha="center", va="center",
            transform=ax.transAxes, color="0.4", fontsize="small")
