"""Decode of the kinds of attention current models run, at the same context on one roofline: GQA over a full cache,
a sliding window with sinks (gpt-oss's window layers) and MLA over a latent cache (DeepSeek), each row against its
own roof."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from .kit import (
    SERIES_GID,
    draw_findings,
    finding_handle,
    flag,
    floats,
    group_fields,
    groups,
    impl_colors,
    left_out_note,
    new_figure,
    no_data,
    ordered_impls,
    shown_rows,
)
from .roofline import ROW_ROOF_GID, ceilings_of, draw_roof, x_range

KINDS = ("GQA", "window", "MLA")
KIND_MARKERS = {"GQA": "^", "window": "v", "MLA": "D"}
KIND_COLUMNS = ("kind", "model", "batch", "q_len", "kv_len", "impl", "intensity", "tflops", "gbps", "roof_tflops",
                "pct_roofline", "bound", "above_roof")
CAPTION = ("Decode attention of three kinds at the same cache length, each point a measured row (colour: impl, "
           "marker: kind): GQA reads every key of every kv head; a sliding-window layer reads the last window of "
           "them, whatever the context; MLA reads one latent per token for all the query heads, so its intensity "
           "grows with the heads (DeepSeek-V3's 128 against V2-Lite's 16). Grey dashes are each row's own roof (its "
           "read and write floor at the measured ceilings, capped by the matmul peak), the lines the measured read "
           "roof of each dtype.")


def decode_kind(rows: pd.DataFrame) -> pd.Series:
    """'MLA' (op mla), 'window' (a decode attention row with a sliding window), 'GQA' (one without), '' otherwise."""
    op = rows["op"].fillna("attention").replace("", "attention") if "op" in rows.columns else \
        pd.Series("attention", index=rows.index)
    window = floats(rows["window_left"]) if "window_left" in rows.columns else np.full(len(rows), -1.0)
    decode = (rows["phase"] == "decode").to_numpy()
    attention = (op == "attention").to_numpy() & decode
    kind = np.where(op.to_numpy() == "mla", "MLA", np.where(attention & (np.nan_to_num(window, nan=-1) >= 0),
                                                            "window", np.where(attention, "GQA", "")))
    return pd.Series(kind, index=rows.index)


def decode_kinds_table(df: pd.DataFrame) -> pd.DataFrame:
    """The rows the figure draws (ok, compiled, not noisy; above-roof rows flagged): decode rows of each kind at the
    cache lengths where every kind present in their group was measured, sorted by group, context, kind, model,
    batch and impl."""
    keys = group_fields(df)
    rows = shown_rows(df)
    if rows.empty:
        return pd.DataFrame(columns=keys + list(KIND_COLUMNS))
    rows = rows.assign(kind=decode_kind(rows))
    rows = rows[rows["kind"] != ""]
    shared = []
    for _, group in (rows.groupby(keys, dropna=False) if keys else [((), rows)]):
        present = group["kind"].nunique()
        counts = group.groupby("kv_len")["kind"].nunique()
        shared.append(group[group["kv_len"].isin(counts[counts == present].index)])
    rows = pd.concat(shared) if shared else rows.iloc[0:0]
    rows = rows.assign(_kind=rows["kind"].map(KINDS.index))
    order = keys + ["kv_len", "_kind", "model", "batch", "q_len", "impl"]
    rows = rows.sort_values(order, kind="stable")
    return rows[keys + [c for c in KIND_COLUMNS if c in rows.columns] + ["dtype", "peak_tflops", "read_gbps",
                                                                         "write_gbps", "peak_gbps"]
                ].reset_index(drop=True)


def decode_kinds_roofline(df: pd.DataFrame, *, figsize=None) -> Figure:
    """One panel per (device, mode, timer) group and shared cache length: achieved TFLOP/s against intensity (log-log)
    of each kind's decode rows, every row's own roof (gid "row_roof"), the measured read roof and matmul peak per
    dtype; rows above their roof drawn hollow."""
    title = "Decode attention by kind at the same context: GQA, sliding window with sinks, MLA"
    table = decode_kinds_table(df)
    if table.empty:
        return no_data(title, "no ok decode row of GQA, window or MLA attention to show")
    panels = [(label, context, part) for label, group in groups(table)
              for context, part in group.groupby("kv_len", sort=True)]
    columns = max(sum(1 for p in panels if p[0] == label) for label, *_ in panels)
    rows_of = list(dict.fromkeys(label for label, *_ in panels))
    fig, axes = new_figure(len(rows_of), columns, figsize=figsize or (5.2 * columns + 2.4, 4.4 * len(rows_of)))
    for ax in axes.flat:
        ax.set_axis_off()
    colors = impl_colors(table["impl"].unique())
    placed = {label: 0 for label in rows_of}
    for label, context, part in panels:
        ax = axes[rows_of.index(label), placed[label]]
        placed[label] += 1
        ax.set_axis_on()
        _panel(ax, part, colors)
        ax.set_title(f"context {int(context)}" + (f"\n{label}" if len(rows_of) > 1 else ""), fontsize="medium")
    handles = [Line2D([], [], linestyle="", marker="o", color=colors[i], label=i)
               for i in ordered_impls(table["impl"].unique())]
    handles += [Line2D([], [], linestyle="", marker=KIND_MARKERS[k], color="0.35", label=k)
                for k in KINDS if k in set(table["kind"])]
    handles.append(Line2D([], [], linestyle="", marker="_", markersize=10, color="0.35", label="the row's own roof"))
    if flag(table, "above_roof").any():
        handles.append(finding_handle())
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 6), fontsize="small",
               frameon=False)
    fig.suptitle(title + (f"\n{rows_of[0]}" if len(rows_of) == 1 else "") + left_out_note(df))
    return fig


def _panel(ax, rows: pd.DataFrame, colors: dict) -> None:
    ax.set_xscale("log")
    ax.set_yscale("log")
    for (impl, kind), group in rows.groupby(["impl", "kind"], sort=False):
        found = flag(group, "above_roof")
        ax.scatter(floats(group.loc[~found, "intensity"]), floats(group.loc[~found, "tflops"]), color=colors[impl],
                   marker=KIND_MARKERS[kind], s=44, alpha=0.85, edgecolors="white", linewidths=0.6, zorder=3,
                   gid=SERIES_GID)
        draw_findings(ax, floats(group.loc[found, "intensity"]), floats(group.loc[found, "tflops"]), group[found],
                      color=colors[impl], marker=KIND_MARKERS[kind])
        for x, y, batch, model in zip(floats(group["intensity"]), floats(group["tflops"]), group["batch"],
                                      group["model"], strict=True):
            ax.annotate(f"{model or kind} b{batch}", (x, y), textcoords="offset points", xytext=(4, -9),
                        fontsize="xx-small", color="0.35")
    ax.scatter(floats(rows["intensity"]), floats(rows["roof_tflops"]), marker="_", s=90, color="0.35",
               linewidths=1.2, zorder=2.5, gid=ROW_ROOF_GID)
    ceilings = ceilings_of(rows, None)
    low, high = x_range(rows, ceilings)
    for ceiling in ceilings:
        read = ceiling["read"] if np.isfinite(ceiling["read"]) else ceiling["copy"]
        line = draw_roof(ax, read, ceiling["tflops"], low, high, "0.3", "-", 1.4, (4, 4))
        if line is not None:
            line.set_label(f"{ceiling['dtype']} read roof")
    ax.set_xlim(low, high)
    ax.set_xlabel("arithmetic intensity (FLOP/byte, minimum bytes)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.grid(True, which="major", alpha=0.3)
