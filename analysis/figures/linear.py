"""Linear layers against batch size: where decode turns compute-bound, the weight floor, layer tokens/s."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from .kit import (
    CEILING_GID,
    LINESTYLES,
    SERIES_GID,
    describe,
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
)

PROJECTIONS = ("qkv", "o", "gate_up", "down", "lm_head")
LAYER_PROJECTIONS = ("qkv", "o", "gate_up", "down")  # one decoder layer; the lm_head runs once per step
RIDGE_GID = "ridge"  # the vertical line at the M where intensity reaches the ridge
FLOOR_GID = "floor"  # the time to read the weights once at the measured bandwidth
# Only used where a row's bytes cannot give its element size.
_ELEMENT_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}

CROSSING_COLUMNS = (
    "n", "k", "rows", "noisy", "ridge_intensity", "crossing_m", "m_min", "m_max",
    "memory_bound_at_min_m", "compute_bound_at_max_m", "tflops_at_max_m", "gbps_at_min_m",
    "weight_floor_ms", "latency_at_min_m_ms", "floor_pct",
)


# ---------------------------------------------------------------- the cost model of x [M, K] · w [N, K]


def linear_intensity(m, n, k, elem):
    """FLOP per byte of the minimum traffic: 2·M·N·K / (elem·(M·K + N·K + M·N))."""
    m, n, k, elem = (np.asarray(v, dtype=float) for v in (m, n, k, elem))
    return 2 * m * n * k / (elem * (m * k + n * k + m * n))


def crossing_m(ridge, n, k, elem) -> float:
    """The M at which linear_intensity(M, N, K) equals `ridge` (FLOP/B); inf where it never does
    (its limit for large M, 2·N·K / (elem·(N + K)), stays at or under the ridge)."""
    # 2MNK = ridge·elem·(MK + NK + MN)  =>  M = ridge·elem·N·K / (2NK - ridge·elem·(N + K))
    scale = ridge * elem
    denominator = 2.0 * n * k - scale * (n + k)
    if not np.isfinite(scale) or scale <= 0:
        return np.nan
    return float(scale * n * k / denominator) if denominator > 0 else np.inf


def weight_floor_ms(n, k, elem, gbps):
    """Milliseconds to read the weights once (elem·N·K bytes) at `gbps`."""
    return np.asarray(elem, dtype=float) * n * k / (np.asarray(gbps, dtype=float) * 1e6)


def element_bytes(rows: pd.DataFrame) -> np.ndarray:
    """Bytes per element of each linear row, from its bytes and shape (the dtype's size where bytes is missing)."""
    m, n, k = floats(rows["m"]), floats(rows["n"]), floats(rows["k"])
    from_bytes = floats(rows["bytes"]) / (m * k + n * k + m * n)
    by_dtype = rows["dtype"].map(_ELEMENT_BYTES).to_numpy(dtype=float, na_value=np.nan)
    return np.where(np.isfinite(from_bytes) & (from_bytes > 0), from_bytes, by_dtype)


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
    """Measured ceilings and the panel's shape: peak TFLOP/s and GB/s, ridge, elem, N, K, crossing M."""
    tflops, gbps = _median(rows, "peak_tflops"), _median(rows, "peak_gbps")
    elem = float(np.nanmedian(element_bytes(rows)))
    n, k = float(rows["n"].iloc[0]), float(rows["k"].iloc[0])
    ridge = tflops * 1e3 / gbps
    return {"tflops": tflops, "gbps": gbps, "ridge": ridge, "elem": elem, "n": n, "k": k,
            "crossing": crossing_m(ridge, n, k, elem)}


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
    (interpreter-mode rows never): the measured ridge (peak_tflops·1000/peak_gbps FLOP/B), the M
    where the intensity of this N, K crosses it (analytic), the M range measured, whether the
    smallest M is memory-bound and the largest compute-bound (the rows' `bound`), and over the
    rows that are not noisy: TFLOP/s at the largest M, GB/s and latency at the smallest, against
    the weight-streaming floor (elem·N·K bytes at the measured GB/s; floor_pct = 100·floor/latency).
    `rows` and `noisy` count the rows behind each line."""
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
        floor = float(weight_floor_ms(roof["n"], roof["k"], roof["elem"], roof["gbps"]))
        latency = _median(clean_small, "latency_ms")
        found.append({
            **dict(zip(fields, key[:-2], strict=True)),
            "n": int(roof["n"]), "k": int(roof["k"]), "rows": len(part),
            "noisy": int(len(part) - part.index.isin(clean_index).sum()),
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
    compute ceiling and the bandwidth slope (peak GB/s × intensity(M)), on the GB/s panel the
    bandwidth ceiling and what the compute ceiling allows, on the latency panel the roofline
    time and the weight-streaming floor (elem·N·K bytes at the measured GB/s, gid "floor").
    The vertical line (gid "ridge") is the M where this N, K reaches the measured ridge.

    Interpreter-mode and noisy rows are left out (the title counts them). Data lines carry
    gid "series", roofs gid "ceiling".
    """
    title = "Linear layers against batch size M"
    if model is not None:
        title += f" · {model}"
    linear = _linear(df, model, projections)
    rows = performance_rows(linear)
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
    measured = _per_m(rows, [name for name, _ in _SWEEP_METRICS])
    for impl in ordered_impls(rows["impl"].unique()):
        per_m = _per_m(rows[rows["impl"] == impl], [name for name, _ in _SWEEP_METRICS])
        for ax, (metric, _) in zip(axes, _SWEEP_METRICS, strict=True):
            ax.plot(per_m.index, per_m[metric], color=colors[impl], marker="o", markersize=4, label=impl,
                    gid=SERIES_GID)
    ms = _m_grid(measured.index.to_numpy(dtype=float), roof["crossing"])
    intensity = linear_intensity(ms, roof["n"], roof["k"], roof["elem"])
    tflops_ax, gbps_ax, latency_ax = axes
    grey = dict(color="0.35", linewidth=1.2, gid=CEILING_GID)
    if np.isfinite(roof["tflops"]):
        tflops_ax.plot(ms, np.full_like(ms, roof["tflops"]), linestyle="-",
                       label=f"compute ceiling {roof['tflops']:.4g} TFLOP/s", **grey)
        gbps_ax.plot(ms, roof["tflops"] * 1e3 / intensity, linestyle="--", label="compute ceiling as GB/s", **grey)
    if np.isfinite(roof["gbps"]):
        tflops_ax.plot(ms, intensity * roof["gbps"] / 1e3, linestyle="--",
                       label=f"bandwidth slope {roof['gbps']:.4g} GB/s × intensity", **grey)
        gbps_ax.plot(ms, np.full_like(ms, roof["gbps"]), linestyle="-",
                     label=f"bandwidth ceiling {roof['gbps']:.4g} GB/s", **grey)
        floor = float(weight_floor_ms(roof["n"], roof["k"], roof["elem"], roof["gbps"]))
        latency_ax.axhline(floor, color="0.2", linestyle=":", linewidth=1.4, gid=FLOOR_GID,
                           label=f"weight-streaming floor {floor:.3g} ms")
    if np.isfinite(roof["tflops"]) and np.isfinite(roof["gbps"]):
        flops = 2 * ms * roof["n"] * roof["k"]
        moved = roof["elem"] * (ms * roof["k"] + roof["n"] * roof["k"] + ms * roof["n"])
        roof_ms = np.maximum(flops / (roof["tflops"] * 1e9), moved / (roof["gbps"] * 1e6))
        latency_ax.plot(ms, roof_ms, linestyle="--", label="roofline time", **grey)
        if np.isfinite(roof["crossing"]):
            for ax in axes:
                ax.axvline(roof["crossing"], color="#444", linestyle="-.", linewidth=1.1, gid=RIDGE_GID,
                           label=f"ridge {roof['ridge']:.3g} FLOP/B at M ≈ {roof['crossing']:.3g}")
        else:
            tflops_ax.text(0.02, 0.02, f"intensity never reaches the ridge ({roof['ridge']:.3g} FLOP/B)",
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
    roofline_tokens_per_s is what the measured roofline allows (every projection at
    max(FLOPs / peak TFLOP/s, bytes / peak GB/s))."""
    keys = group_fields(df) + ["model", "dtype", "impl", "m"]
    per_projection = [f"{name}_ms" for name in LAYER_PROJECTIONS]
    columns = keys + per_projection + ["layer_ms", "tokens_per_s", "roofline_tokens_per_s"]
    rows = performance_rows(_linear(df, model, LAYER_PROJECTIONS))
    if rows.empty:
        return pd.DataFrame(columns=columns)
    flops, moved = floats(rows["flops"]), floats(rows["bytes"])
    roof_ms = np.maximum(flops / (floats(rows["peak_tflops"]) * 1e9), moved / (floats(rows["peak_gbps"]) * 1e6))
    rows = rows.assign(_roof_ms=roof_ms)
    medians = rows.groupby(keys + ["projection"], dropna=False, observed=True)[["latency_ms", "_roof_ms"]].median()
    latency = medians["latency_ms"].unstack("projection").reindex(columns=list(LAYER_PROJECTIONS))
    roof = medians["_roof_ms"].unstack("projection").reindex(columns=list(LAYER_PROJECTIONS))
    complete = latency.notna().all(axis=1)
    latency, roof = latency[complete], roof[complete]
    if latency.empty:
        return pd.DataFrame(columns=columns)
    table = latency.set_axis(per_projection, axis=1)
    table["layer_ms"] = latency.sum(axis=1)
    m = table.index.get_level_values("m").to_numpy(dtype=float)
    table["tokens_per_s"] = m / (table["layer_ms"].to_numpy() / 1e3)
    table["roofline_tokens_per_s"] = m / (roof.sum(axis=1, min_count=len(LAYER_PROJECTIONS)).to_numpy() / 1e3)
    table = table.reset_index()
    table.columns.name = None
    return table.sort_values(keys, kind="stable").reset_index(drop=True)[columns]


def layer_tokens_per_second(df: pd.DataFrame, model: str | None = None, *, figsize=None) -> Figure:
    """Tokens/s of one decoder layer's projections (qkv + o + gate_up + down) against M (log2),
    one line per impl (split by model and dtype where several), one panel per (device, mode,
    timer) group, with the measured roofline's tokens/s dashed (gid "ceiling"). Only M values
    where all four projections were measured; interpreter-mode and noisy rows are left out
    (the title counts them). See layer_tokens_per_second_table for the numbers."""
    title = "Tokens/s of one decoder layer's projections (qkv + o + gate_up + down)"
    if model is not None:
        title += f" · {model}"
    linear = _linear(df, model, LAYER_PROJECTIONS)
    table = layer_tokens_per_second_table(df, model)
    if table.empty:
        if ok_rows(linear).empty:
            return no_data(title, "no ok qkv/o/gate_up/down linear rows"
                           + (f" for model {model!r}" if model is not None else ""))
        if performance_rows(linear).empty:
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
