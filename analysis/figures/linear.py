"""Linear layers against batch size: where decode turns compute-bound, the weight floor, layer tokens/s."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ...bench.spec.roof import roof_of_row
from .kit import (
    CEILING_GID,
    LINESTYLES,
    SERIES_GID,
    describe,
    draw_findings,
    draw_intervals,
    flag,
    floats,
    group_fields,
    groups,
    impl_colors,
    interpreter,
    left_out_note,
    new_figure,
    no_data,
    no_performance,
    ok_rows,
    one_group_note,
    op_rows,
    ordered_impls,
    performance_rows,
    shown_rows,
)
from .linear_roof import crossing_m, element_bytes, linear_intensity, linear_roof, weight_floor_ms

__all__ = ["crossing_m", "layer_tokens_per_second", "layer_tokens_per_second_table", "linear_crossings",
           "linear_intensity", "linear_roof", "linear_sweep", "weight_floor_ms"]

PROJECTIONS = ("qkv", "o", "gate_up", "down", "lm_head")
LAYER_PROJECTIONS = ("qkv", "o", "gate_up", "down")  # one decoder layer; the lm_head runs once per step
RIDGE_GID = "ridge"  # the vertical line at the M where intensity reaches the ridge
FLOOR_GID = "floor"  # the time to read the weights once at the measured bandwidth

CROSSING_COLUMNS = (
    "n", "k", "rows", "noisy", "above_roof", "ridge_intensity", "crossing_m", "m_min", "m_max",
    "memory_bound_at_min_m", "compute_bound_at_max_m", "tflops_at_max_m", "gbps_at_min_m",
    "weight_floor_ms", "latency_at_min_m_ms", "floor_pct",
)


# ---------------------------------------------------------------- rows


def _linear(df: pd.DataFrame, model=None, projections=None) -> pd.DataFrame:
    """The linear rows, of one model and some projections if given."""
    rows = op_rows(df, "linear")
    if model is not None:
        rows = rows[rows["model"] == model]
    if projections is not None:
        wanted = [projections] if isinstance(projections, str) else list(projections)
        if not all(isinstance(name, str) for name in wanted):
            raise ValueError(f"projections: expected projection names, got {projections!r}")
        rows = rows[rows["projection"].isin(wanted)]
    return rows


def _projection_rank(name: str) -> tuple:
    return (PROJECTIONS.index(name), "") if name in PROJECTIONS else (len(PROJECTIONS), name)


def _median(rows: pd.DataFrame, column: str) -> float:
    values = floats(rows[column]) if column in rows.columns else np.array([])
    values = values[np.isfinite(values) & (values > 0)]
    return float(np.median(values)) if len(values) else np.nan


def _roofs(rows: pd.DataFrame) -> dict:
    """Measured ceilings and the panel's shape: peak TFLOP/s, read, write and copy GB/s, elem, N, K, the M where
    it turns compute-bound (crossing), the intensity there (ridge) and the read ceiling that weights stream at. The
    compute ceiling is the highest of the rows' own (each the matmul ceiling of what its kernel multiplies in: naive
    upcasts to fp32 where F.linear multiplies bf16), the roof none of them can pass."""
    peaks = floats(rows["peak_tflops"]) if "peak_tflops" in rows.columns else np.array([])
    peaks = peaks[np.isfinite(peaks) & (peaks > 0)]
    found = {"tflops": float(peaks.max()) if len(peaks) else np.nan, "read": _median(rows, "read_gbps"),
             "write": _median(rows, "write_gbps"), "copy": _median(rows, "peak_gbps")}
    elem = float(np.nanmedian(element_bytes(rows)))
    n, k = float(rows["n"].iloc[0]), float(rows["k"].iloc[0])
    crossing = crossing_m(n, k, elem, found)
    ridge = float(linear_intensity(crossing, n, k, elem)) if np.isfinite(crossing) else np.nan
    stream = found["read"] if np.isfinite(found["read"]) else found["copy"]  # before schema 5, the copy alone
    return {**found, "elem": elem, "n": n, "k": k, "crossing": crossing, "ridge": ridge, "stream": stream}


_PANEL_KEYS = ("model", "dtype", "projection", "n", "k")


def _panels(rows: pd.DataFrame) -> list[tuple[dict, pd.DataFrame]]:
    """(key, rows) per (model, dtype, projection, N, K): one shape, so one intensity curve."""
    found = [(dict(zip(_PANEL_KEYS, key, strict=True)), part)
             for key, part in rows.groupby(list(_PANEL_KEYS), sort=False, dropna=False)]
    return sorted(found, key=lambda item: (item[0]["model"], item[0]["dtype"], _projection_rank(item[0]["projection"]),
                                           item[0]["n"], item[0]["k"]))


def _per_m(rows: pd.DataFrame, columns) -> pd.DataFrame:
    return rows.assign(_m=floats(rows["m"])).groupby("_m")[list(columns)].median().sort_index()


# ---------------------------------------------------------------- crossings


def linear_crossings(df: pd.DataFrame) -> pd.DataFrame:
    """Per (device, mode, timer, profiled, model, projection, dtype, impl) of the ok linear rows
    (interpreter-mode rows never): the M from which this N, K is compute-bound under the measured
    roof (crossing_m: its FLOPs at the matmul peak reach its floor of elem·(M·K + N·K) bytes read and
    elem·M·N written at the read and write ceilings) and the intensity there (ridge_intensity), the M
    range measured, whether the smallest M is memory-bound and the largest compute-bound (the rows'
    `bound`), and over the rows neither noisy nor above their roof: TFLOP/s at the largest M, GB/s and
    latency at the smallest, against the weight-streaming floor (elem·N·K bytes at the measured read
    GB/s; floor_pct = 100·floor/latency). `rows`, `noisy` and `above_roof` count the rows behind each line."""
    fields = group_fields(df) + ["model", "projection", "dtype", "impl"]
    columns = fields + list(CROSSING_COLUMNS)
    rows = ok_rows(op_rows(df, "linear"))
    rows = rows[~interpreter(rows)]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    clean_index = performance_rows(rows).index
    found = []
    for key, part in rows.groupby(fields + ["n", "k"], sort=False, dropna=False):
        roof = _roofs(part)
        m = floats(part["m"])
        small, large = part[m == np.nanmin(m)], part[m == np.nanmax(m)]
        clean_small, clean_large = small[small.index.isin(clean_index)], large[large.index.isin(clean_index)]
        floor = float(weight_floor_ms(roof["n"], roof["k"], roof["elem"], roof["stream"]))
        latency = _median(clean_small, "latency_ms")
        found.append({
            **dict(zip(fields, key[:-2], strict=True)),
            "n": int(roof["n"]), "k": int(roof["k"]), "rows": len(part),
            "noisy": int(flag(part, "noisy").sum()), "above_roof": int((flag(part, "above_roof")
                                                                        & ~flag(part, "noisy")).sum()),
            "ridge_intensity": roof["ridge"], "crossing_m": roof["crossing"],
            "m_min": int(np.nanmin(m)), "m_max": int(np.nanmax(m)),
            "memory_bound_at_min_m": _all_bound(small, "memory"),
            "compute_bound_at_max_m": _all_bound(large, "compute"),
            "tflops_at_max_m": _median(clean_large, "tflops"), "gbps_at_min_m": _median(clean_small, "gbps"),
            "weight_floor_ms": floor, "latency_at_min_m_ms": latency, "floor_pct": 100 * floor / latency,
        })
    table = pd.DataFrame(found, columns=columns)
    table["memory_bound_at_min_m"] = table["memory_bound_at_min_m"].astype("boolean")
    table["compute_bound_at_max_m"] = table["compute_bound_at_max_m"].astype("boolean")
    impl_rank = {impl: index for index, impl in enumerate(ordered_impls(table["impl"].unique()))}
    order = sorted(range(len(table)), key=lambda i: (
        tuple(str(table.at[i, name]) for name in group_fields(df)), table.at[i, "model"],
        _projection_rank(table.at[i, "projection"]), table.at[i, "dtype"], impl_rank[table.at[i, "impl"]]))
    return table.iloc[order].reset_index(drop=True)


def _all_bound(rows: pd.DataFrame, which: str):
    """True/False when every row says what bounds it, NA when some do not."""
    bound = rows["bound"].astype(str)
    if (bound == "").any():
        return pd.NA
    return bool((bound == which).all())


# ---------------------------------------------------------------- the batch sweep figure

_SWEEP_METRICS = (("tflops", "achieved TFLOP/s"), ("gbps", "achieved GB/s (minimum bytes)"),
                  ("latency_ms", "latency (ms)"))


def linear_sweep(df: pd.DataFrame, *, model: str | None = None, projections=None, figsize=None) -> Figure:
    """The batch sweep of the linear layers: per projection (a row of panels per (device, mode,
    timer) group, model, dtype and shape), achieved TFLOP/s, GB/s and latency against M (log2),
    one line per impl (the median per M), under the measured roofs as functions of M: the
    compute ceiling and the memory roof (FLOPs / the floor of its reads and writes at the read and
    write ceilings), on the GB/s panel the GB/s that floor allows and what the compute ceiling
    allows, on the latency panel the roofline time and the weight-streaming floor (elem·N·K bytes
    at the measured read GB/s, gid "floor"). The vertical line (gid "ridge") is the M from which
    this N, K is compute-bound.

    Interpreter-mode and noisy rows are left out (the title counts them); rows above their roof are
    hollow points, out of the lines; each row's 95% interval is a bar at its own value (gid
    "interval"). Data lines carry gid "series", roofs gid "ceiling".
    """
    title = "Linear layers against batch size M"
    if model is not None:
        title += f" · {model}"
    linear = _linear(df, model, projections)
    rows = shown_rows(linear)
    if rows.empty:
        if ok_rows(linear).empty:
            return no_data(title, "no ok linear rows" + (f" for model {model!r}" if model is not None else ""))
        return no_performance(title, linear)
    plan = [(label, key, part) for label, group in groups(rows) for key, part in _panels(group)]
    single_group = len(groups(rows)) == 1
    fig, axes = new_figure(len(plan), len(_SWEEP_METRICS), figsize=figsize or (15.5, 3.9 * len(plan) + 0.8))
    for panel_axes, (label, key, part) in zip(axes, plan, strict=True):
        _sweep_row(panel_axes, part)
        heading = f"{key['model'] or '(no preset)'} · {key['projection'] or '(no projection)'}" \
                  f" (N={key['n']}, K={key['k']}) · {key['dtype']}"
        for ax in panel_axes:
            ax.set_title(heading if single_group else f"{label}\n{heading}", fontsize="medium")
    fig.suptitle(title + one_group_note(rows) + left_out_note(linear))
    return fig


def _sweep_row(axes, rows: pd.DataFrame) -> None:
    roof = _roofs(rows)
    colors = impl_colors(rows["impl"].unique())
    found = flag(rows, "above_roof")
    measured = _per_m(rows, [name for name, _ in _SWEEP_METRICS])
    for impl in ordered_impls(rows["impl"].unique()):
        mine = rows["impl"] == impl
        per_m = _per_m(rows[mine & ~found], [name for name, _ in _SWEEP_METRICS])
        for ax, (metric, _) in zip(axes, _SWEEP_METRICS, strict=True):
            ax.plot(per_m.index, per_m[metric], color=colors[impl], marker="o", markersize=4, label=impl,
                    gid=SERIES_GID)
            above = rows[mine & found]
            draw_findings(ax, floats(above["m"]), floats(above[metric]), above, color=colors[impl], size=24)
            draw_intervals(ax, floats(rows.loc[mine, "m"]), floats(rows.loc[mine, metric]), rows[mine],
                           inverse=metric != "latency_ms", color=colors[impl])
    ms = _m_grid(measured.index.to_numpy(dtype=float), roof["crossing"])
    roof_s = linear_roof(ms, roof["n"], roof["k"], roof["elem"], roof)[1]
    moved = roof["elem"] * (ms * roof["k"] + roof["n"] * roof["k"] + ms * roof["n"])
    floor_s = linear_roof(ms, roof["n"], roof["k"], roof["elem"], {**roof, "tflops": np.inf})[1]
    tflops_ax, gbps_ax, latency_ax = axes
    grey = dict(color="0.35", linewidth=1.2, gid=CEILING_GID)
    intensity = linear_intensity(ms, roof["n"], roof["k"], roof["elem"])
    if np.isfinite(roof["tflops"]):
        tflops_ax.plot(ms, np.full_like(ms, roof["tflops"]), linestyle="-",
                       label=f"compute ceiling {roof['tflops']:.4g} TFLOP/s", **grey)
        gbps_ax.plot(ms, roof["tflops"] * 1e3 / intensity, linestyle="--", label="compute ceiling as GB/s", **grey)
    if np.isfinite(floor_s).all():
        what = "read/write floor" if np.isfinite(roof["read"]) else "copy"
        tflops_ax.plot(ms, 2 * ms * roof["n"] * roof["k"] / floor_s / 1e12, linestyle="--",
                       label=f"memory roof: FLOPs / {what} time", **grey)
        gbps_ax.plot(ms, moved / floor_s / 1e9, linestyle="-",
                     label=f"memory roof: bytes / {what} time (read {roof['read']:.4g}, write {roof['write']:.4g}, "
                           f"copy {roof['copy']:.4g} GB/s)", **grey)
        floor = float(weight_floor_ms(roof["n"], roof["k"], roof["elem"], roof["stream"]))
        latency_ax.axhline(floor, color="0.2", linestyle=":", linewidth=1.4, gid=FLOOR_GID,
                           label=f"weight-streaming floor {floor:.3g} ms")
    if np.isfinite(roof_s).all() and np.isfinite(roof["tflops"]):
        latency_ax.plot(ms, roof_s * 1e3, linestyle="--", label="roofline time", **grey)
        if np.isfinite(roof["crossing"]):
            for ax in axes:
                ax.axvline(roof["crossing"], color="#444", linestyle="-.", linewidth=1.1, gid=RIDGE_GID,
                           label=f"compute-bound from M ≈ {roof['crossing']:.3g} ({roof['ridge']:.3g} FLOP/B)")
        else:
            tflops_ax.text(0.02, 0.02, "memory-bound at every M under the measured roof",
                           transform=tflops_ax.transAxes, fontsize="x-small", color="0.35")
    for ax, (_, label) in zip(axes, _SWEEP_METRICS, strict=True):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("M (batch or prompt tokens)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    handles = {}
    for ax in axes:  # one legend per row, right of the latency panel; the ridge line is on all three
        for handle, text in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(text, handle)
    latency_ax.legend(handles.values(), handles.keys(), loc="upper left", bbox_to_anchor=(1.02, 1.0),
                      fontsize="x-small", frameon=False)


def _m_grid(measured: np.ndarray, crossing: float) -> np.ndarray:
    points = list(measured[np.isfinite(measured) & (measured > 0)])
    if np.isfinite(crossing) and crossing > 0:
        points.append(crossing)
    low, high = min(points) / 2, max(points) * 2
    return np.geomspace(low, high, 64)


# ---------------------------------------------------------------- one decoder layer


def layer_tokens_per_second_table(df: pd.DataFrame, model: str | None = None) -> pd.DataFrame:
    """Tokens/s of one decoder layer's projections against M: per (device, mode, timer,
    profiled, model, dtype, impl, M) the median latency of each of qkv, o, gate_up and down
    (ok rows, not interpreter-mode, not noisy), their sum layer_ms and tokens_per_s =
    M / layer_ms; only the M values where all four projections were measured.
    roofline_tokens_per_s is what the measured roofline allows (every projection at its roof
    time, max(FLOPs / peak TFLOP/s, its read and write floor): bench.spec.roof); above_roof where
    a row of the sum stood above its roof (a finding: the figure draws the point hollow)."""
    keys = group_fields(df) + ["model", "dtype", "impl", "m"]
    per_projection = [f"{name}_ms" for name in LAYER_PROJECTIONS]
    columns = keys + per_projection + ["layer_ms", "tokens_per_s", "roofline_tokens_per_s", "above_roof"]
    rows = shown_rows(_linear(df, model, LAYER_PROJECTIONS))
    if rows.empty:
        return pd.DataFrame(columns=columns)
    rows = rows.assign(_roof_ms=roof_of_row(rows)[1] * 1e3, _above=flag(rows, "above_roof"))
    grouped = rows.groupby(keys + ["projection"], dropna=False, observed=True)
    medians = grouped[["latency_ms", "_roof_ms"]].median()
    latency = medians["latency_ms"].unstack("projection").reindex(columns=list(LAYER_PROJECTIONS))
    roof = medians["_roof_ms"].unstack("projection").reindex(columns=list(LAYER_PROJECTIONS))
    above = grouped["_above"].any().unstack("projection").reindex(columns=list(LAYER_PROJECTIONS))
    complete = latency.notna().all(axis=1)
    latency, roof, above = latency[complete], roof[complete], above[complete]
    if latency.empty:
        return pd.DataFrame(columns=columns)
    table = latency.set_axis(per_projection, axis=1)
    table["layer_ms"] = latency.sum(axis=1)
    m = table.index.get_level_values("m").to_numpy(dtype=float)
    table["tokens_per_s"] = m / (table["layer_ms"].to_numpy() / 1e3)
    table["roofline_tokens_per_s"] = m / (roof.sum(axis=1, min_count=len(LAYER_PROJECTIONS)).to_numpy() / 1e3)
    table["above_roof"] = above.fillna(False).astype(bool).any(axis=1).to_numpy()
    table = table.reset_index()
    table.columns.name = None
    return table.sort_values(keys, kind="stable").reset_index(drop=True)[columns]


def layer_tokens_per_second(df: pd.DataFrame, model: str | None = None, *, figsize=None) -> Figure:
    """Tokens/s of one decoder layer's projections (qkv + o + gate_up + down) against M (log2),
    one line per impl (split by model and dtype where several), one panel per (device, mode,
    timer) group, with the measured roofline's tokens/s dashed (gid "ceiling"). Only M values
    where all four projections were measured; interpreter-mode and noisy rows are left out
    (the title counts them); a point whose sum holds a row above its roof is hollow and labelled.
    See layer_tokens_per_second_table for the numbers."""
    title = "Tokens/s of one decoder layer's projections (qkv + o + gate_up + down)"
    if model is not None:
        title += f" · {model}"
    linear = _linear(df, model, LAYER_PROJECTIONS)
    table = layer_tokens_per_second_table(df, model)
    if table.empty:
        if ok_rows(linear).empty:
            return no_data(title, "no ok qkv/o/gate_up/down linear rows"
                           + (f" for model {model!r}" if model is not None else ""))
        if shown_rows(linear).empty:
            return no_performance(title, linear)
        return no_data(title, "no M at which all four projections were measured")
    panels = groups(table)
    fig, axes = new_figure(1, len(panels), figsize=figsize or (3.5 + 5.5 * len(panels), 5.2))
    split = [name for name in ("model", "dtype") if table[name].nunique() > 1]
    for ax, (label, part) in zip(axes[0], panels, strict=True):
        colors = impl_colors(part["impl"].unique())
        variants = part[split].drop_duplicates().sort_values(split).itertuples(index=False) if split else [()]
        style_of = {tuple(v): LINESTYLES[i % len(LINESTYLES)] for i, v in enumerate(variants)}
        for impl in ordered_impls(part["impl"].unique()):
            of_impl = part[part["impl"] == impl]
            for key, line in (of_impl.groupby(split, sort=True) if split else [((), of_impl)]):
                key = key if isinstance(key, tuple) else (key,)
                ax.plot(floats(line["m"]), floats(line["tokens_per_s"]), color=colors[impl], marker="o",
                        markersize=4, linestyle=style_of[tuple(key)], gid=SERIES_GID,
                        label=describe({"impl": impl, **dict(zip(split, key, strict=True))}))
                hollow = line[line["above_roof"].astype(bool)]
                draw_findings(ax, floats(hollow["m"]), floats(hollow["tokens_per_s"]), None, color=colors[impl])
        for key, line in (part.groupby(split, sort=True) if split else [((), part)]):
            key = key if isinstance(key, tuple) else (key,)
            per_m = line.groupby("m")["roofline_tokens_per_s"].median().sort_index()
            what = describe(dict(zip(split, key, strict=True)))
            ax.plot(per_m.index.to_numpy(dtype=float), per_m.to_numpy(dtype=float), color="0.35", linestyle="--",
                    linewidth=1.2, gid=CEILING_GID, label="measured roofline" + (f" · {what}" if what else ""))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("M (batch: tokens per step)")
        ax.set_ylabel("tokens/s (M / summed latency)")
        ax.grid(True, alpha=0.3)
        ax.set_title(label, fontsize="medium")
        ax.legend(loc="best", fontsize="x-small", frameon=False)
    fig.suptitle(title + left_out_note(linear))
    return fig
