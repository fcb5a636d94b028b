"""Shared plotting helpers: the rows a plot may show and their groups, Agg figures, stable colours and markers."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ...bench.spec.interval import ratio_interval
from ...bench.spec.schema import ABOVE_ROOF_PCT, PHASES, cell_true
from ...bench.spec.store.files import write_file

# Figures are built without pyplot: no global state, no GUI backend, nothing to close;
# Jupyter still renders a returned Figure inline.

IMPL_ORDER = ("naive", "flash", "triton", "sdpa_efficient", "cudnn", "torch")
OPS = ("attention", "linear", "qlinear")
PHASE_MARKERS = {"prefill": "o", "chunked_prefill": "s", "decode": "^"}
LINEAR_MARKERS = {"prefill": "D", "decode": "v"}
QLINEAR_MARKERS = {"prefill": "X", "decode": "P"}  # quantized weights: their points sit right of linear's
EXTRA_MARKERS = ("D", "v", "P", "X", "*", "<", ">")
LINESTYLES = ("-", "--", ":", "-.")
# Rows that differ in any of these are never pooled: not in a median, a speedup or a plot.
GROUP_FIELDS = ("device", "mode", "timer", "profiled")
SERIES_GID = "series"  # gid of lines that carry data (tests and callers can find them)
CEILING_GID = "ceiling"
FINDING_GID = "above_roof"  # rows above their roof, drawn hollow with their share of the roof
INTERVAL_GID = "interval"  # a row's 95% interval of its median latency, carried into the figure drawn

_PALETTE = (
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e",
    "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f",
)


def new_figure(nrows: int = 1, ncols: int = 1, *, figsize=None, squeeze: bool = False, **kwargs):
    """A Figure with an Agg canvas and its axes grid (a 2-D array unless squeeze)."""
    if figsize is None:
        figsize = (4.8 * ncols + 1.2, 3.8 * nrows + 0.6)
    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=squeeze, **kwargs)
    return fig, axes


def save_png(fig: Figure, path, dpi: int) -> bytes:
    """`fig` as PNG at `path`, renamed into place whole (a reader never sees half a figure); returns the bytes."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    write_file(path, buffer.getvalue())
    return buffer.getvalue()


def no_data(title: str, why: str, *, figsize=(6.0, 3.0)) -> Figure:
    """A figure that says there is nothing to plot, instead of raising."""
    fig, axes = new_figure(figsize=figsize)
    ax = axes[0, 0]
    ax.set_axis_off()
    ax.set_title(title)
    ax.text(0.5, 0.5, f"no data: {why}", ha="center", va="center", transform=ax.transAxes, color="0.4")
    return fig


def op_rows(df: pd.DataFrame, op: str) -> pd.DataFrame:
    """The rows of one operator; rows of a frame without an op column are attention rows."""
    if "op" not in df.columns:
        return df if op == "attention" else df.iloc[0:0]
    return df[df["op"].fillna("attention").replace("", "attention") == op]


def ordered_ops(ops) -> list[str]:
    present = set(ops)
    return [op for op in OPS if op in present] + sorted(present - set(OPS))


def ok_rows(df: pd.DataFrame, phase: str | None = None) -> pd.DataFrame:
    """Rows with status 'ok' (the only ones with performance figures), of one phase if given."""
    if "status" not in df.columns:
        return df.iloc[0:0]
    rows = df[df["status"] == "ok"]
    return rows if phase is None else rows[rows["phase"] == phase]


def flag(rows: pd.DataFrame, column: str) -> pd.Series:
    """A boolean column as plain bools (blank: False); all False where the column is absent."""
    if column not in rows.columns:
        return pd.Series(False, index=rows.index)
    return rows[column].fillna(False).astype(bool)


def interpreter(rows: pd.DataFrame) -> pd.Series:
    """Rows timed in the Triton interpreter: they prove correctness, their timings are not performance."""
    if "mode" not in rows.columns:
        return pd.Series(False, index=rows.index)
    return rows["mode"] == "interpreter"


def performance_rows(df: pd.DataFrame, phase: str | None = None) -> pd.DataFrame:
    """The ok rows a median, a line or a best-of may use: not interpreter-mode, not noisy, not above their roof."""
    rows = ok_rows(df, phase)
    return rows[~interpreter(rows) & ~flag(rows, "noisy") & ~flag(rows, "above_roof")]


def finding_rows(df: pd.DataFrame, phase: str | None = None) -> pd.DataFrame:
    """The quiet compiled ok rows above their measured roof: findings, drawn hollow and labelled, never in a median."""
    rows = ok_rows(df, phase)
    return rows[~interpreter(rows) & ~flag(rows, "noisy") & flag(rows, "above_roof")]


def shown_rows(df: pd.DataFrame, phase: str | None = None) -> pd.DataFrame:
    """What a figure draws: the performance rows and the findings (above_roof tells them apart)."""
    rows = ok_rows(df, phase)
    return rows[~interpreter(rows) & ~flag(rows, "noisy")]


def draw_findings(ax, xs, ys, rows: pd.DataFrame | None, *, color="0.2", marker="o", size: float = 40) -> None:
    """Rows above their roof as hollow markers (gid "above_roof"), each labelled with its share of the roof (`rows`'
    pct_roofline; None: a point that stands for several rows, labelled "above roof")."""
    xs, ys = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    if not len(xs):
        return
    ax.scatter(xs, ys, facecolors="none", edgecolors=color, marker=marker, s=size, linewidths=1.4, zorder=5,
               gid=FINDING_GID)
    known = rows is not None and "pct_roofline" in rows.columns
    pcts = floats(rows["pct_roofline"]) if known else np.full(len(xs), np.nan)
    for x, y, pct in zip(xs, ys, pcts, strict=True):
        if np.isfinite(x) and np.isfinite(y):
            text = f"{pct:.0f}%" if np.isfinite(pct) else "above roof"
            ax.annotate(text, (x, y), textcoords="offset points", xytext=(5, 4), fontsize="xx-small", color=color,
                        gid=FINDING_GID)


def finding_handle():
    """The legend entry of the hollow markers."""
    from matplotlib.lines import Line2D

    return Line2D([], [], linestyle="", marker="o", markerfacecolor="none", markeredgecolor="0.3",
                  label=f"hollow: above its roof (> {ABOVE_ROOF_PCT:g}%, a finding)")


def left_out_note(df: pd.DataFrame, phase: str | None = None) -> str:
    """A title suffix that counts the ok rows a figure leaves out (interpreter-mode, noisy) and the rows above their
    roof it draws hollow."""
    rows = ok_rows(df, phase)
    in_interpreter = interpreter(rows)
    counts = {
        "interpreter-mode rows (correctness only)": int(in_interpreter.sum()),
        "noisy rows (device contended)": int((flag(rows, "noisy") & ~in_interpreter).sum()),
    }
    parts = [f"{count} {what}" for what, count in counts.items() if count]
    above = len(finding_rows(df, phase))
    notes = [f"left out: {'; '.join(parts)}"] if parts else []
    notes += [f"hollow: {above} above {'their' if above != 1 else 'its'} roof"] if above else []
    return f"\n({'; '.join(notes)})" if notes else ""


def no_performance(title: str, df: pd.DataFrame, phase: str | None = None) -> Figure:
    """The 'no data' figure when shown_rows() is empty, saying whether ok rows were left out."""
    what = f"ok {phase} rows" if phase else "rows with status 'ok'"
    if ok_rows(df, phase).empty:
        return no_data(title, f"no {what}")
    return no_data(title, f"every one of the {what} is interpreter-mode or noisy")


def group_fields(df: pd.DataFrame) -> list[str]:
    return [name for name in GROUP_FIELDS if name in df.columns]


def group_label(values: dict) -> str:
    """'NVIDIA H200 · compiled · cuda_events' (· profiled) for one (device, mode, timer, profiled) group."""
    parts = [
        str(values.get("device") or "(unknown device)"),
        str(values.get("mode") or "(no mode)"),
        str(values.get("timer") or "(no timer)"),
    ]
    if cell_true(values.get("profiled")):
        parts.append("profiled")
    return " · ".join(parts)


def one_group_note(rows: pd.DataFrame) -> str:
    """A title line naming the group when every row is of one group (labels then show impls only)."""
    found = groups(rows)
    return f"\n{found[0][0]}" if len(found) == 1 else ""


def groups(rows: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(label, rows) per (device, mode, timer, profiled) group, in a stable order."""
    fields = group_fields(rows)
    if not fields:
        return [(group_label({}), rows)]
    found = []
    for key, group in rows.groupby(fields, sort=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        found.append((group_label(dict(zip(fields, key, strict=True))), group))
    return found


def ordered_impls(impls) -> list[str]:
    known = [name for name in IMPL_ORDER if name in set(impls)]
    return known + sorted(set(impls) - set(known))


def impl_colors(impls) -> dict[str, str]:
    """One colour per impl; the known impls keep the same colour in every plot."""
    names = list(IMPL_ORDER) + sorted(set(impls) - set(IMPL_ORDER))
    return {name: _PALETTE[index % len(_PALETTE)] for index, name in enumerate(names)}


def phase_marker(phase: str) -> str:
    if phase in PHASE_MARKERS:
        return PHASE_MARKERS[phase]
    return EXTRA_MARKERS[sum(map(ord, phase)) % len(EXTRA_MARKERS)]  # stable across processes


def op_phase_marker(op: str, phase: str) -> str:
    """Attention keeps the phase markers; linear rows get markers of their own."""
    if op == "linear" and phase in LINEAR_MARKERS:
        return LINEAR_MARKERS[phase]
    if op == "qlinear" and phase in QLINEAR_MARKERS:
        return QLINEAR_MARKERS[phase]
    if op in ("attention", ""):
        return phase_marker(phase)
    return EXTRA_MARKERS[sum(map(ord, op + phase)) % len(EXTRA_MARKERS)]


def ordered_phases(phases) -> list[str]:
    present = set(phases)
    return [phase for phase in PHASES if phase in present] + sorted(present - set(PHASES))


def floats(series: pd.Series) -> np.ndarray:
    """A column as a float array (nullable ints and booleans included), NA as NaN."""
    return pd.to_numeric(series, errors="coerce").to_numpy(dtype=float, na_value=np.nan)


def optional(rows: pd.DataFrame, column: str) -> np.ndarray:
    """A column as floats, all NaN where the frame lacks it (a file of an older schema)."""
    return floats(rows[column]) if column in rows.columns else np.full(len(rows), np.nan)


def varying(df: pd.DataFrame, columns) -> list[str]:
    """The columns (of those given and present) that hold more than one value in df."""
    return [name for name in columns if name in df.columns and df[name].nunique(dropna=False) > 1]


def describe(values: dict) -> str:
    """'impl · bfloat16 · b4' style label from {column: value}."""
    parts = []
    for name, value in values.items():
        if name in ("batch",):
            parts.append(f"b{value}")
        elif name in ("q_heads", "kv_heads", "head_dim"):
            parts.append(f"{name}={value}")
        elif name == "causal":
            parts.append("causal" if value else "non-causal")
        elif name == "profiled":
            parts.append("profiled" if cell_true(value) else "not profiled")
        elif name == "page_size":
            parts.append(f"page {value}" if value else "contiguous")
        elif value == "":
            parts.append("(none)")
        else:
            parts.append(str(value))
    return " · ".join(parts)


def categories(df: pd.DataFrame, extra=GROUP_FIELDS + ("dtype",)) -> pd.Series:
    """Per-row category label: the impl, plus device, mode, timer, profiled and dtype where those vary in df."""
    shown = varying(df, extra)
    if not shown:
        return df["impl"].astype(str)
    return df[["impl", *shown]].apply(lambda row: describe(row.to_dict()), axis=1)


def series_fields(df: pd.DataFrame, fields) -> list[str]:
    """The fields that take several values within one impl: they must split an impl's lines."""
    present = [name for name in fields if name in df.columns]
    return [name for name in present if (df.groupby("impl")[name].nunique(dropna=False) > 1).any()]


def spread(count: int, width: float = 0.5) -> np.ndarray:
    """Deterministic horizontal offsets for a strip of `count` points."""
    if count <= 1:
        return np.zeros(count)
    return np.linspace(-width / 2, width / 2, count)



def interval_ends(rows: pd.DataFrame, values, *, inverse: bool) -> tuple[np.ndarray, np.ndarray]:
    """The low and high ends of the values a figure derives from each row's latency: proportional to it (latency)
    or, with `inverse`, to its inverse (TFLOP/s, GB/s, % of roof, tokens/s), at the ends of the row's 95% interval
    of its median (schema 7); NaN where a row has none (older files, interpreter rows)."""
    values = np.asarray(values, dtype=float)
    if "latency_ci_low_ms" not in rows.columns:
        return np.full(len(values), np.nan), np.full(len(values), np.nan)
    latency, low, high = (floats(rows[name]) for name in ("latency_ms", "latency_ci_low_ms", "latency_ci_high_ms"))
    with np.errstate(divide="ignore", invalid="ignore"):
        if inverse:
            return values * latency / high, values * latency / low
        return values * low / latency, values * high / latency


def ratio_ends(num: tuple, den: tuple) -> tuple[np.ndarray, np.ndarray]:
    """The 95% interval of num / den per row, each side given as (median, low, high) arrays of latencies
    (bench.spec.interval.ratio_interval); NaN where a side has no interval."""
    ends = [ratio_interval(a, b)[1:] for a, b in zip(zip(*num, strict=True), zip(*den, strict=True), strict=True)]
    return np.array([e[0] for e in ends], dtype=float), np.array([e[1] for e in ends], dtype=float)


def draw_bars(ax, xs, ys, low, high, color="0.3") -> None:
    """A vertical bar from low to high at each point (gid "interval"); points without both ends draw none."""
    xs, ys, low, high = (np.asarray(v, dtype=float) for v in (xs, ys, low, high))
    known = np.isfinite(xs) & np.isfinite(ys) & np.isfinite(low) & np.isfinite(high)
    if known.any():
        arms = np.clip(np.vstack([ys[known] - low[known], high[known] - ys[known]]), 0.0, None)
        ax.errorbar(xs[known], ys[known], yerr=arms, fmt="none", ecolor=color, elinewidth=0.9, capsize=2, alpha=0.75,
                    zorder=2.8, gid=INTERVAL_GID)


def end_names(column: str, suffix: str = "") -> tuple[str, str]:
    """The names of a composed table column's 95% interval ends: ttft_ms: ttft_low_ms and ttft_high_ms; speedup:
    speedup_low and speedup_high; error_pct: error_low_pct and error_high_pct (`suffix` after them)."""
    stem, unit = (column[:-3], "_ms") if column.endswith("_ms") else (column[:-4], "_pct") \
        if column.endswith("_pct") else (column, "")
    return f"{stem}_low{unit}{suffix}", f"{stem}_high{unit}{suffix}"


def column_ends(table: pd.DataFrame, column: str, suffix: str = "") -> tuple[np.ndarray, np.ndarray] | None:
    """The 95% interval ends of a composed table's column (end_names); None where the table has none."""
    low, high = end_names(column, suffix)
    return (floats(table[low]), floats(table[high])) if low in table and high in table else None


def column_bars(ax, xs, table: pd.DataFrame, column: str, color="0.3") -> None:
    """A composed table column's 95% interval (column_ends) as bars at its points, where the table has its ends."""
    ends = column_ends(table, column)
    if ends is not None:
        draw_bars(ax, xs, floats(table[column]), *ends, color=color)


def draw_intervals(ax, xs, ys, rows: pd.DataFrame, *, inverse: bool, color="0.3") -> None:
    """Each row's interval carried into the value drawn (interval_ends) as a bar at its point."""
    draw_bars(ax, xs, ys, *interval_ends(rows, ys, inverse=inverse), color=color)
