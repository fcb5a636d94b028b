"""Roofline plot: achieved TFLOP/s against arithmetic intensity, under the measured (and datasheet) ceilings.
The decode roofline of the kinds of attention current models run (GQA, a sliding window with sinks, MLA), at the
same context, each row against its own roof."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from .kit import (
    CEILING_GID,
    SERIES_GID,
    draw_findings,
    draw_intervals,
    finding_handle,
    flag,
    floats,
    group_fields,
    groups,
    impl_colors,
    left_out_note,
    new_figure,
    no_data,
    no_performance,
    op_phase_marker,
    ordered_impls,
    ordered_ops,
    ordered_phases,
    shown_rows,
)

_CEILING_SHADES = ("0.1", "0.45", "0.3", "0.6", "0.2", "0.5")
ROW_ROOF_GID = "row_roof"  # each row's own roof: min(peak, FLOPs / its read and write floor)
# The bandwidth slopes drawn per (device, dtype): read is the roof of decode and GEMV, write and copy lighter.
# (stream, column, width, alpha, line style when it does not lead); the leading one is solid.
_STREAMS = (("read", "read_gbps", 1.6, 1.0, "-"), ("write", "write_gbps", 0.9, 0.6, ":"),
            ("copy", "peak_gbps", 0.9, 0.6, "-."))


def roofline(
    df: pd.DataFrame,
    *,
    datasheet: dict | None = None,
    title: str = "Roofline",
    figsize=None,
    legend: str = "right",
) -> Figure:
    """Log-log roofline of the ok rows of every operator: one point per row, colour = impl,
    marker = operator and phase (attention and linear rows have markers of their own), one
    panel per (device, mode, timer) group (titled with it).

    Interpreter-mode and noisy rows are left out (the title counts them); rows above their roof are
    drawn hollow, labelled with their share of it (gid "above_roof"). Each point's bar is its TFLOP/s at
    the ends of the 95% interval of its median latency (gid "interval"). For each (device, compute dtype) in a
    panel the measured ceilings (medians of the rows' read_gbps, write_gbps, peak_gbps (the copy) and
    peak_tflops) are drawn as three roofs: read solid with its ridge point marked (the roof of decode and
    GEMV), write dotted and copy dash-dotted, lighter (files before schema 5 have the copy alone, solid);
    each row's own roof, min(peak, FLOPs / (read bytes / read GB/s + write bytes / write GB/s)), is a grey
    dash at its intensity (gid "row_roof"); datasheet ceilings are dashed. `datasheet` is either
    {"peak_gbps": float, "peak_tflops": {dtype: float}} (applies to every device, the layout of run.json
    ceilings.datasheet; its bandwidth compares with the read roof) or a dict of those keyed by device
    name; without it the loader's datasheet_gbps/datasheet_tflops columns are used, and nothing is drawn
    where they are missing. Points carry gid "series". `legend` "below" puts the legend under each panel
    in columns (a narrower figure whose plot keeps its width), "right" beside it.
    """
    if legend not in ("right", "below"):
        raise ValueError(f"legend: expected 'right' or 'below', got {legend!r}")
    rows = shown_rows(df)
    if rows.empty:
        return no_performance(title, df)
    panels = groups(rows)
    below = legend == "below"
    width, height = (8.0, 6.6) if below else (9.5, 6.0)
    fig, axes = new_figure(len(panels), 1, figsize=figsize or (width, height * len(panels)))
    colors = impl_colors(rows["impl"].unique())
    ceilings = []
    for ax, (label, group) in zip(axes[:, 0], panels, strict=True):
        ceilings += _panel(ax, group, colors, datasheet, below)
        ax.set_title(label, fontsize="medium")
    if ceilings:  # legend "below": every panel's ceilings, one per line, under the figure
        fig.legend(handles=ceilings, loc="outside lower center", fontsize="small", frameon=False)
    fig.suptitle(title + left_out_note(df))
    return fig


def _panel(ax, rows: pd.DataFrame, colors: dict, datasheet: dict | None, below: bool = False) -> list:
    """Draw one group's points and roofs; with `below`, return the ceilings' legend handles for the figure."""
    ax.set_xscale("log")
    ax.set_yscale("log")
    rows = rows.assign(_op=_ops(rows))
    for (impl, op, phase), group in rows.groupby(["impl", "_op", "phase"], sort=False):
        found = flag(group, "above_roof")
        if not found.all():
            ax.scatter(
                floats(group.loc[~found, "intensity"]), floats(group.loc[~found, "tflops"]),
                color=colors[impl], marker=op_phase_marker(op, phase), s=40, alpha=0.85,
                edgecolors="white", linewidths=0.6, zorder=3, gid=SERIES_GID,
            )
        draw_findings(ax, floats(group.loc[found, "intensity"]), floats(group.loc[found, "tflops"]), group[found],
                      color=colors[impl], marker=op_phase_marker(op, phase))
        draw_intervals(ax, floats(group["intensity"]), floats(group["tflops"]), group, inverse=True,
                       color=colors[impl])
    if "roof_tflops" in rows.columns:
        ax.scatter(floats(rows["intensity"]), floats(rows["roof_tflops"]), marker="_", s=90, color="0.35",
                   linewidths=1.2, zorder=2.5, gid=ROW_ROOF_GID)

    ceilings = ceilings_of(rows, datasheet)
    x_low, x_high = x_range(rows, ceilings)
    ceiling_handles = []
    for index, ceiling in enumerate(ceilings):
        shade = _CEILING_SHADES[index % len(_CEILING_SHADES)]
        name = f"{ceiling['device']} · {ceiling['dtype']}"
        main = "read" if np.isfinite(ceiling["read"]) else "copy"  # a file before schema 5 has the copy alone
        for stream, _, width, alpha, style in _STREAMS:
            if not np.isfinite(ceiling[stream]) and stream != main:
                continue  # a stream the rows lack (files before schema 5 have the copy alone)
            lead = stream == main
            handle = draw_roof(ax, ceiling[stream], ceiling["tflops"], x_low, x_high, shade, "-" if lead else style,
                                1.6 if lead else width, (4, 4), ridge=lead, alpha=1.0 if lead else alpha)
            if handle is not None:
                handle.set_label(f"{name} {stream} ({_describe_roof(ceiling[stream], ceiling['tflops'])})")
                ceiling_handles.append(handle)
        handle = draw_roof(
            ax, ceiling["sheet_gbps"], ceiling["sheet_tflops"], x_low, x_high, shade, "--", 1.0, (4, -10)
        )
        if handle is not None:
            handle.set_label(f"{name} datasheet ({_describe_roof(ceiling['sheet_gbps'], ceiling['sheet_tflops'])})")
            ceiling_handles.append(handle)
    if "roof_tflops" in rows.columns:
        ceiling_handles.append(Line2D([], [], linestyle="", marker="_", markersize=10, color="0.35",
                                      label="a row's own roof (its read and write floor)"))
    if flag(rows, "above_roof").any():
        ceiling_handles.append(finding_handle())

    ax.set_xlim(x_low, x_high)
    ax.set_xlabel("arithmetic intensity (FLOP/byte, minimum bytes)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.grid(True, which="major", alpha=0.3)
    impl_handles = [
        Line2D([], [], linestyle="", marker="o", color=colors[impl], label=impl)
        for impl in ordered_impls(rows["impl"].unique())
    ]
    ops = ordered_ops(rows["_op"].unique())
    phase_handles = [
        Line2D([], [], linestyle="", marker=op_phase_marker(op, phase), color="0.35",
               label=phase if ops == ["attention"] else f"{op} · {phase}")
        for op in ops
        for phase in ordered_phases(rows.loc[rows["_op"] == op, "phase"].unique())
    ]
    if below:  # impls and markers in columns under the panel; the ceilings go under the figure
        ax.legend(handles=impl_handles + phase_handles, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3,
                  fontsize="small", frameon=False)
        return ceiling_handles
    ax.legend(
        handles=impl_handles + phase_handles + ceiling_handles,
        loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small", frameon=False,
    )
    return []


def _ops(rows: pd.DataFrame) -> pd.Series:
    if "op" not in rows.columns:
        return pd.Series("attention", index=rows.index)
    return rows["op"].fillna("attention").replace("", "attention")


def ceilings_of(rows: pd.DataFrame, datasheet: dict | None) -> list[dict]:
    """Measured and datasheet ceilings per (device, precision the rows' kernels multiply in) of the plotted rows."""
    found = []
    key = "compute_dtype" if "compute_dtype" in rows.columns else "dtype"  # before schema 7: the rows' dtype
    for (device, dtype), group in rows.groupby(["device", key], sort=True):
        sheet_gbps, sheet_tflops = _datasheet_for(group, device, dtype, datasheet)
        found.append({
            "device": device or "(unknown device)",
            "dtype": dtype,
            **{stream: _median(group, column) for stream, column, *_ in _STREAMS},
            "tflops": _median(group, "peak_tflops"),
            "sheet_gbps": sheet_gbps,
            "sheet_tflops": sheet_tflops,
        })
    return found


def _datasheet_for(group: pd.DataFrame, device: str, dtype: str, datasheet: dict | None):
    if datasheet is None:
        return _median(group, "datasheet_gbps"), _median(group, "datasheet_tflops")
    entry = datasheet if ("peak_gbps" in datasheet or "peak_tflops" in datasheet) else datasheet.get(device)
    if not isinstance(entry, dict):
        return np.nan, np.nan
    per_dtype = entry.get("peak_tflops")
    tflops = per_dtype.get(dtype) if isinstance(per_dtype, dict) else per_dtype
    return _positive(entry.get("peak_gbps")), _positive(tflops)


def _median(group: pd.DataFrame, column: str) -> float:
    if column not in group.columns:
        return np.nan
    return _positive(np.nanmedian(floats(group[column]))) if group[column].notna().any() else np.nan


def _positive(value) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return np.nan
    return value if np.isfinite(value) and value > 0 else np.nan


def x_range(rows: pd.DataFrame, ceilings: list[dict]) -> tuple[float, float]:
    xs = floats(rows["intensity"])
    xs = list(xs[np.isfinite(xs) & (xs > 0)])
    for ceiling in ceilings:
        pairs = [(ceiling[stream], ceiling["tflops"]) for stream, *_ in _STREAMS]
        for gbps, tflops in pairs + [(ceiling["sheet_gbps"], ceiling["sheet_tflops"])]:
            if np.isfinite(gbps) and np.isfinite(tflops):
                xs.append(tflops * 1e3 / gbps)  # ridge point
    if not xs:
        return 0.1, 1000.0
    return min(xs) / 4, max(xs) * 4


def draw_roof(ax, gbps, tflops, x_low, x_high, shade: str, style: str, width: float, text_offset, *,
               ridge: bool = True, alpha: float = 1.0):
    """Draw min(x * gbps / 1000, tflops), with its ridge point marked if `ridge`; returns the roof line (or None)."""
    has_memory, has_compute = np.isfinite(gbps), np.isfinite(tflops)
    style_kw = dict(color=shade, linestyle=style, linewidth=width, gid=CEILING_GID, zorder=2, alpha=alpha)
    if has_memory and has_compute:
        at = tflops * 1e3 / gbps
        xs = [x for x in (x_low, at, x_high) if x_low <= x <= x_high]
        (line,) = ax.plot(xs, np.minimum(np.array(xs) * gbps / 1e3, tflops), **style_kw)
        if ridge:
            ax.plot([at], [tflops], marker="o", markersize=6, markerfacecolor="white",
                    markeredgecolor=shade, linestyle="", gid=CEILING_GID, zorder=4)
            ax.annotate(f"ridge {at:.3g}", (at, tflops), textcoords="offset points", xytext=text_offset,
                        fontsize="x-small", color=shade)
        return line
    if has_memory:
        (line,) = ax.plot([x_low, x_high], [x_low * gbps / 1e3, x_high * gbps / 1e3], **style_kw)
        return line
    if has_compute:
        (line,) = ax.plot([x_low, x_high], [tflops, tflops], **style_kw)
        return line
    return None


def _describe_roof(gbps: float, tflops: float) -> str:
    parts = []
    if np.isfinite(gbps):
        parts.append(f"{gbps:.4g} GB/s")
    if np.isfinite(tflops):
        parts.append(f"{tflops:.4g} TFLOP/s")
    return ", ".join(parts)


# Decode of the kinds of attention current models run, at the same context on one roofline: GQA over a full cache,
# a sliding window with sinks (gpt-oss's window layers) and MLA over a latent cache (DeepSeek).
# An fp8 KV cache (kv_dtype fp8: one byte an element) is a kind of its own, so its point sits beside the same decode
# in the dtype: half the bytes, twice the intensity, further up the read slope.
FP8_KV = " fp8 KV"
KINDS = ("GQA", "GQA" + FP8_KV, "window", "window" + FP8_KV, "MLA", "MLA" + FP8_KV)
KIND_MARKERS = {"GQA": "^", "window": "v", "MLA": "D", **{k + FP8_KV: m for k, m in (("GQA", ">"), ("window", "<"),
                                                                                    ("MLA", "d"))}}
KIND_COLUMNS = ("kind", "model", "batch", "q_len", "kv_len", "impl", "intensity", "tflops", "gbps", "roof_tflops",
                "pct_roofline", "bound", "above_roof", "latency_ms", "latency_ci_low_ms", "latency_ci_high_ms",
                "cache_state")
CAPTION = ("Decode attention of three kinds at the same cache length, each point a measured row (colour: impl, "
           "marker: kind): GQA reads every key of every kv head; a sliding-window layer reads the last window of "
           "them, whatever the context; MLA reads one latent per token for all the query heads, so its intensity "
           "grows with the heads (DeepSeek-V3's 128 against V2-Lite's 16); an fp8 KV cache (its own marker) reads "
           "one byte an element, so its point moves up the read slope from the same decode in the dtype. Grey dashes "
           "are each row's own roof (its read and write floor at the measured ceilings, capped by the matmul peak), "
           "the lines the measured read roof of each dtype.")


def decode_kind(rows: pd.DataFrame) -> pd.Series:
    """'MLA' (op mla), 'window' (a decode attention row with a sliding window), 'GQA' (one without), '' otherwise;
    ' fp8 KV' after it for a row whose cache (or latent) is fp8."""
    op = rows["op"].fillna("attention").replace("", "attention") if "op" in rows.columns else \
        pd.Series("attention", index=rows.index)
    window = floats(rows["window_left"]) if "window_left" in rows.columns else np.full(len(rows), -1.0)
    decode = (rows["phase"] == "decode").to_numpy()
    attention = (op == "attention").to_numpy() & decode
    kind = np.where(op.to_numpy() == "mla", "MLA", np.where(attention & (np.nan_to_num(window, nan=-1) >= 0),
                                                            "window", np.where(attention, "GQA", "")))
    fp8 = (rows["kv_dtype"].fillna("") == "fp8").to_numpy() if "kv_dtype" in rows.columns else False
    return pd.Series(np.where(fp8 & (kind != ""), np.char.add(kind.astype(str), FP8_KV), kind), index=rows.index)


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
        base = group["kind"].str.replace(FP8_KV, "", regex=False)  # an fp8 row shows at the contexts of its kind
        present = base.nunique()
        counts = group.assign(kind=base).groupby("kv_len")["kind"].nunique()
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
        _kinds_panel(ax, part, colors)
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


def _kinds_panel(ax, rows: pd.DataFrame, colors: dict) -> None:
    ax.set_xscale("log")
    ax.set_yscale("log")
    for (impl, kind), group in rows.groupby(["impl", "kind"], sort=False):
        found = flag(group, "above_roof")
        ax.scatter(floats(group.loc[~found, "intensity"]), floats(group.loc[~found, "tflops"]), color=colors[impl],
                   marker=KIND_MARKERS[kind], s=44, alpha=0.85, edgecolors="white", linewidths=0.6, zorder=3,
                   gid=SERIES_GID)
        draw_findings(ax, floats(group.loc[found, "intensity"]), floats(group.loc[found, "tflops"]), group[found],
                      color=colors[impl], marker=KIND_MARKERS[kind])
        draw_intervals(ax, floats(group["intensity"]), floats(group["tflops"]), group, inverse=True,
                       color=colors[impl])
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
