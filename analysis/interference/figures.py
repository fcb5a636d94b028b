"""Interference figures: the decode step's stretch against prompt length, each user's tokens/s against the
targets."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from ..figures.kit import SERIES_GID, floats, new_figure, no_data
from ..phases.model import USER_TARGETS
from .rows import mode_label, ordered

MODE_COLORS = {"alone": "#2ca02c", "colocated": "#d62728", "protected": "#1f77b4"}
MECHANISM_STYLES = ("-", "--", ":", "-.")
CAPTIONS = {
    "interference_stretch": "Median decode step beside a looped prefill of the prompt length on the x axis, over the "
                            "median alone (1 = no interference), one panel per decode batch. Hollow markers: rows "
                            "timed while something besides the co-runner used the device (NOISY).",
    "interference_users": "Tokens/s each decode user sees (1000 / median decode step) alone, co-located and "
                          "protected, against 3 and 10 tok/s. Hollow markers: NOISY rows.",
}


def _heading(rows: pd.DataFrame, what: str) -> str:
    first = rows.iloc[0]
    return f"{what} · {first['model']} ({first['layers']} layers) · {first['device']} · {first['dtype']}"


def _series(rows: pd.DataFrame):
    """(label, colour, linestyle, rows) per device, mode and mechanism; the device named only where several are."""
    several = rows["device"].nunique() > 1
    mechanisms: dict[str, list[str]] = {}
    for (device, mode, mechanism), group in ordered(rows).groupby(["device", "mode", "mechanism"], sort=False):
        styles = mechanisms.setdefault(mode, [])
        if mechanism not in styles:
            styles.append(mechanism)
        label = mode_label(mode, mechanism) + (f" · {device}" if several else "")
        yield label, MODE_COLORS.get(mode, "0.4"), MECHANISM_STYLES[styles.index(mechanism) % 4], group


def _by_batch(rows: pd.DataFrame, column: str, figsize=None):
    """A figure with a panel per decode batch (shared y), `column` against prompt drawn per series in each."""
    batches = sorted(int(b) for b in rows["batch"].unique())
    fig, axes = new_figure(1, len(batches), figsize=figsize, sharey=True)
    panels = {batch: axes[0, i] for i, batch in enumerate(batches)}
    for label, color, style, group in _series(rows):
        for batch, part in group.groupby("batch"):
            _draw(panels[int(batch)], part, column, label, color, style)
    return fig, panels


def _finish(fig: Figure, panels: dict, rows: pd.DataFrame, ylabel: str, title: str) -> Figure:
    first = next(iter(panels.values()))
    first.set_ylabel(ylabel)
    first.legend(fontsize="small")
    fig.suptitle(_heading(rows, title) + _noisy_note(rows))
    return fig


def _draw(ax, group: pd.DataFrame, column: str, label: str, color: str, style: str) -> None:
    group = group.sort_values("prompt")
    x, y = floats(group["prompt"]), floats(group[column])
    ax.plot(x, y, linestyle=style, color=color, gid=SERIES_GID, label=label)
    noisy = group["noisy"].fillna(False).astype(bool).to_numpy()
    ax.scatter(x[~noisy], y[~noisy], color=color, zorder=3)
    ax.scatter(x[noisy], y[noisy], facecolors="none", edgecolors=color, zorder=3, gid="noisy")


def _prompt_axis(ax, rows: pd.DataFrame) -> None:
    ax.set_xscale("log", base=2)
    ticks = sorted({int(p) for p in rows["prompt"]})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("prompt tokens of the co-located prefill")
    ax.grid(True, alpha=0.3)


def _noisy_note(rows: pd.DataFrame) -> str:
    count = int(rows["noisy"].fillna(False).astype(bool).sum())
    return f"\n({count} NOISY point(s), hollow)" if count else ""


def stretch_figure(rows: pd.DataFrame, *, figsize=None) -> Figure:
    """ITL stretch (co-located or protected decode step / alone) against prompt length, a panel per decode batch,
    a line per mode and mechanism."""
    ok = rows[(rows["status"] == "ok") & (rows["mode"] != "alone")] if len(rows) else rows
    if not len(ok):
        return no_data("Interference: ITL stretch", "no co-located or protected rows with status 'ok'")
    fig, panels = _by_batch(ok, "stretch", figsize)
    for batch, ax in panels.items():
        ax.axhline(1.0, color=MODE_COLORS["alone"], linewidth=1, gid="alone", label="alone")
        _prompt_axis(ax, ok)
        ax.set_title(f"decode batch {batch} at context {int(ok['context'].iloc[0])}", fontsize="medium")
    return _finish(fig, panels, ok, "decode step / decode step alone", "Interference: ITL stretch")


def user_rate_figure(rows: pd.DataFrame, *, figsize=None) -> Figure:
    """Tokens/s per decode user alone, co-located and protected against prompt length, a panel per decode batch,
    with the 3 and 10 tok/s targets."""
    ok = rows[rows["status"] == "ok"] if len(rows) else rows
    if not len(ok):
        return no_data("Interference: what each user sees", "no rows with status 'ok'")
    fig, panels = _by_batch(ok, "tokens_per_s_per_user", figsize)
    for batch, ax in panels.items():
        for target, style in zip(USER_TARGETS, (":", "--"), strict=True):
            ax.axhline(target, color="0.4", linestyle=style, linewidth=1, gid="target", label=f"{target:g} tok/s")
        _prompt_axis(ax, ok)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_title(f"decode batch {batch}", fontsize="medium")
    return _finish(fig, panels, ok, "tokens/s per user (1000 / decode step ms)", "Interference: what each user sees")


INTERFERENCE_FIGURES = {"interference_stretch": stretch_figure, "interference_users": user_rate_figure}


def write_interference_figures(rows: pd.DataFrame, out_dir, *, dpi: int = 110) -> list[Path]:
    """The interference figures as PNG files in out_dir, named as INTERFERENCE_FIGURES."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, draw in INTERFERENCE_FIGURES.items():
        paths.append(out / f"{name}.png")
        draw(rows).savefig(paths[-1], dpi=dpi)
    return paths
