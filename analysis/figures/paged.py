"""Paged KV caches: achieved GB/s and % of the measured roof against page size, each case's contiguous cache as
the reference line, per impl; the table beside it and what the report's section (report/paged_section.py) shows."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from .kit import (
    GROUP_FIELDS,
    SERIES_GID,
    draw_findings,
    draw_intervals,
    flag,
    floats,
    groups,
    impl_colors,
    left_out_note,
    new_figure,
    no_data,
    no_performance,
    op_rows,
    ordered_impls,
    shown_rows,
)

# The fields of a case but its page size: rows equal on these measured the same case at another page size.
CASE = ("model", "dtype", "phase", "batch", "q_heads", "kv_heads", "q_len", "kv_len", "head_dim", "causal", "seqlens")
TABLE_COLUMNS = ("impl", "case", "page_size", "latency_ms", "gbps", "pct_roofline", "contiguous_gbps",
                 "vs_contiguous", "above_roof")
REFERENCE_GID = "contiguous"  # gid of the contiguous reference lines
TITLE = "Paged KV cache: bandwidth against page size"
CAPTION = ("Per implementation, achieved GB/s (top) and % of the measured roofline (bottom) against the page size "
           "of the KV cache, one line per case; the dashed line of the same colour is that case measured with a "
           "contiguous cache. The bytes are the same at every page size (the keys read, plus the block-table "
           "entries), so the lines compare times. A point is the median of its rows; a hollow one a row above its "
           "roof (a finding, out of the medians).")


def _page_sizes(rows: pd.DataFrame) -> np.ndarray:
    if "page_size" not in rows.columns:
        return np.zeros(len(rows), dtype=int)
    return np.nan_to_num(floats(rows["page_size"]), nan=0.0).astype(int)


def _case_label(values: dict) -> str:
    """'decode b8 q1 k8192' (' ragged' when the batch has per-sequence lengths)."""
    text = f"{values.get('phase', '')} b{values.get('batch')} q{values.get('q_len')} k{values.get('kv_len')}"
    return text + (" ragged" if values.get("seqlens") else "")


def paged_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The attention rows a paged figure shows (quiet compiled ok rows, those above their roof included), of the cases
    measured with at least one page size, their contiguous rows included; with `page_size` (0: contiguous) and a
    `case` label."""
    rows = shown_rows(op_rows(df, "attention"))
    if rows.empty:
        return rows.assign(page_size=[], case=[])
    rows = rows.assign(page_size=_page_sizes(rows))
    keys = [name for name in (*GROUP_FIELDS, "impl", *CASE) if name in rows.columns]
    paged = rows.groupby(keys, dropna=False, sort=False)["page_size"].transform("max") > 0
    rows = rows[paged.to_numpy(dtype=bool)]
    shown = [name for name in CASE if name in rows.columns]
    return rows.assign(case=[_case_label(r) for r in rows[shown].to_dict("records")])


def paged_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per (device, mode, timer, profiled) group, impl, case and page size: median latency, GB/s and % of roof over
    the rows at or under their roof, the contiguous GB/s of the same case and the ratio to it (vs_contiguous, 1 = no
    cost of the pages), and how many rows stood above their roof (findings, in no median)."""
    rows = paged_rows(df)
    fields = [name for name in GROUP_FIELDS if name in rows.columns]
    columns = [*fields, *TABLE_COLUMNS]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    keys = [*fields, "impl", *[name for name in CASE if name in rows.columns], "case", "page_size"]
    found = flag(rows, "above_roof")
    table = rows[~found].groupby(keys, dropna=False, sort=True)[["latency_ms", "gbps", "pct_roofline"]].median()
    table = table.join(found.groupby([rows[k] for k in keys], dropna=False).sum().rename("above_roof"), how="outer")
    table = table.reset_index()
    table["above_roof"] = table["above_roof"].fillna(0).astype(int)
    contiguous = table[table["page_size"] == 0].drop(columns=["page_size", "latency_ms", "pct_roofline",
                                                              "above_roof"])
    contiguous = contiguous.rename(columns={"gbps": "contiguous_gbps"})
    table = table.merge(contiguous, on=keys[:-1], how="left")
    table["vs_contiguous"] = table["gbps"] / table["contiguous_gbps"]
    order = {name: i for i, name in enumerate(ordered_impls(table["impl"].unique()))}
    table = table.sort_values([*fields, "impl", "case", "page_size"],
                              key=lambda c: c.map(order) if c.name == "impl" else c)
    return table[columns].reset_index(drop=True)


def paged_figure(df: pd.DataFrame, *, figsize=None) -> Figure:
    """GB/s (top row) and % of the measured roof (bottom row) against page size (log 2), a column per impl and a
    pair of rows per (device, mode, timer) group; each case's contiguous figure as a dashed line of its colour.
    Interpreter-mode and noisy rows are left out (the title counts them); rows above their roof are hollow points,
    out of the medians; each paged row's bar is its 95% interval. Data lines carry gid "series", the contiguous lines
    gid "contiguous"."""
    attention = op_rows(df, "attention")
    rows = paged_rows(df)
    if rows.empty:
        if shown_rows(attention).empty:
            return no_performance(TITLE, attention)
        return no_data(TITLE, "no case measured with a paged KV cache (page_size > 0)")
    panels = groups(rows)
    impls = ordered_impls(rows["impl"].unique())
    fig, axes = new_figure(2 * len(panels), len(impls), figsize=figsize or (1.5 + 4.6 * len(impls),
                                                                             7.0 * len(panels)))
    for index, (label, group) in enumerate(panels):
        cases = sorted(group["case"].unique())
        colors = impl_colors(cases)  # a stable colour per case label
        for column, impl in enumerate(impls):
            gbps_ax, pct_ax = axes[2 * index, column], axes[2 * index + 1, column]
            mine = group[group["impl"] == impl]
            for case in cases:
                of_case = mine[mine["case"] == case]
                above = flag(of_case, "above_roof")
                medians = of_case[~above].groupby("page_size")[["gbps", "pct_roofline"]].median().sort_index()
                for ax, metric in ((gbps_ax, "gbps"), (pct_ax, "pct_roofline")):
                    draw_findings(ax, floats(of_case.loc[above, "page_size"]).clip(min=1),
                                  floats(of_case.loc[above, metric]), of_case[above], color=colors[case], size=24)
                    shown = of_case[floats(of_case["page_size"]) > 0]
                    draw_intervals(ax, floats(shown["page_size"]), floats(shown[metric]), shown, inverse=True,
                                   color=colors[case])
                    paged = medians[medians.index > 0]
                    if len(paged):
                        ax.plot(paged.index.to_numpy(dtype=float), floats(paged[metric]), marker="o", markersize=4,
                                color=colors[case], label=case, gid=SERIES_GID)
                    if 0 in medians.index:
                        ax.axhline(float(medians.loc[0, metric]), color=colors[case], linestyle="--", linewidth=1,
                                   alpha=0.8, gid=REFERENCE_GID)
            sizes = sorted(int(p) for p in group["page_size"].unique() if p > 0)
            for ax in (gbps_ax, pct_ax):
                ax.set_xscale("log", base=2)
                ax.set_xticks(sizes, [str(s) for s in sizes])
                ax.minorticks_off()
                ax.set_ylim(bottom=0)
                ax.grid(True, alpha=0.3)
            gbps_ax.set_title(f"{impl}\n{label}", fontsize="medium")
            gbps_ax.set_ylabel("achieved GB/s")
            pct_ax.set_ylabel("% of measured roof")
            pct_ax.set_xlabel("page size (tokens); dashed: contiguous")
        axes[2 * index, -1].legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small", frameon=False)
    fig.suptitle(TITLE + left_out_note(attention))
    return fig


def interpreted_paged(df: pd.DataFrame) -> bool:
    """Paged rows exist but none is a performance row (interpreter, noisy): the section still says so."""
    rows = op_rows(df, "attention")
    return bool((_page_sizes(rows) > 0).any()) if len(rows) else False
