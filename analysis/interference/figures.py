"""Interference figures: the hybrid iteration's ITL tail and TTFT against chunk size; spatial sharing's stretch against
prompt length; each user's tokens/s against the targets."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from ..figures.kit import SERIES_GID, floats, new_figure, no_data, save_png
from ..phases.model import USER_TARGETS
from .rows import hybrid, mode_label, ordered, spatial

MODE_COLORS = {"alone": "#2ca02c", "colocated": "#d62728", "protected": "#1f77b4"}
MECHANISM_STYLES = ("-", "--", ":", "-.")
PROMPT_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
CAPTIONS = {
    "interference_chunks": "The hybrid iteration: one prompt's arrival processed with the decode users stepping in "
                           "every iteration, per chunk size (whole = the prompt in one iteration), a column per "
                           "decode batch, a colour per prompt. Top: the users' ITL over the prompt's iterations, p99 "
                           "(solid) and mean (dashed), with the decode-only iteration (dotted). Bottom: the prompt's "
                           "TTFT, with its prefill alone (dotted: separated, no decode users).",
    "interference_stretch": "Median decode step beside a looped prefill of the prompt length on the x axis, over the "
                            "median alone (1 = no interference), one panel per decode batch. Hollow markers: rows "
                            "timed while something besides the co-runner used the device (NOISY).",
    "interference_users": "Tokens/s each decode user sees of the whole model (1000 / mean ITL; where fewer layers "
                          "were timed than the model has, scaled to its layers with the head counted once, as the "
                          "title says) alone, co-located and protected, against 3 and 10 tok/s. Hollow markers: "
                          "NOISY rows.",
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


def _chunk_order(rows: pd.DataFrame) -> list[str]:
    labels = set(rows["chunk"].astype(str))
    return sorted(labels - {"whole"}, key=int) + (["whole"] if "whole" in labels else [])


def chunk_figure(rows: pd.DataFrame, *, figsize=None) -> Figure:
    """The hybrid rows, of the layers timed: ITL tail (the p99 where 100 samples support it, else the max) and mean
    (top) and TTFT (bottom) against the chunk size, a column per decode batch,
    a colour per prompt, the decode-only ITL and the prefill alone as dotted references."""
    ok = hybrid(rows[rows["status"] == "ok"]) if len(rows) else rows
    if not len(ok):
        return no_data("Interference: the hybrid iteration per chunk", "no hybrid rows with status 'ok'")
    order = _chunk_order(ok)
    batches = sorted(int(b) for b in ok["batch"].unique())
    fig, axes = new_figure(2, len(batches), figsize=figsize or (4.2 * len(batches), 6.4), sharex=True)
    prompts = sorted(int(p) for p in ok["prompt"].unique())
    for col, batch in enumerate(batches):
        itl_ax, ttft_ax = axes[0, col], axes[1, col]
        for i, prompt in enumerate(prompts):
            part = ok[(ok["batch"] == batch) & (ok["prompt"] == prompt)]
            if not len(part):
                continue
            part = part.assign(_x=part["chunk"].map(order.index)).sort_values("_x")
            color, x = PROMPT_COLORS[i % len(PROMPT_COLORS)], part["_x"].to_numpy()
            tail = "p99" if (part["itl_tail"] == "p99").all() else "tail (p99, or max of N)"
            itl_ax.plot(x, floats(part["itl_tail_ms"]), "o-", color=color, gid=SERIES_GID,
                        label=f"prompt {prompt} {tail}")
            itl_ax.plot(x, floats(part["itl_mean_ms"]), "s--", color=color, gid=SERIES_GID, label=f"prompt {prompt} "
                                                                                                    "mean")
            itl_ax.axhline(floats(part["decode_only_ms"]).mean(), color=color, linestyle=":", linewidth=1,
                           gid="decode_only")
            ttft_ax.plot(x, floats(part["ttft_ms"]), "o-", color=color, gid=SERIES_GID, label=f"prompt {prompt}")
            alone = floats(part["prefill_alone_ms"])
            if len(alone) and alone[0] == alone[0]:
                ttft_ax.axhline(alone[0], color=color, linestyle=":", linewidth=1, gid="separated")
        itl_ax.set_title(f"decode batch {batch} at context {int(ok['context'].iloc[0])}", fontsize="medium")
        for ax in (itl_ax, ttft_ax):
            ax.set_yscale("log")
            for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
                axis(FuncFormatter(lambda value, _: f"{value:.3g}"))
            ax.grid(True, alpha=0.3)
        ttft_ax.set_xticks(range(len(order)), order)
        ttft_ax.set_xlabel("prompt tokens per iteration (chunk)")
    axes[0, 0].set_ylabel("decode users' ITL (ms)")
    axes[1, 0].set_ylabel("prompt's TTFT (ms)")
    axes[0, 0].legend(fontsize="small")
    fig.suptitle(_heading(ok, "Interference: the hybrid iteration per chunk"))
    return fig


def stretch_figure(rows: pd.DataFrame, *, figsize=None) -> Figure:
    """ITL stretch (co-located or protected decode step / alone) against prompt length, a panel per decode batch,
    a line per mode and mechanism."""
    ok = spatial(rows[(rows["status"] == "ok") & (rows["mode"] != "alone")]) if len(rows) else rows
    if not len(ok):
        return no_data("Interference: ITL stretch", "no co-located or protected rows with status 'ok'")
    fig, panels = _by_batch(ok, "stretch", figsize)
    for batch, ax in panels.items():
        ax.axhline(1.0, color=MODE_COLORS["alone"], linewidth=1, gid="alone", label="alone")
        _prompt_axis(ax, ok)
        ax.set_title(f"decode batch {batch} at context {int(ok['context'].iloc[0])}", fontsize="medium")
    return _finish(fig, panels, ok, "decode step / decode step alone", "Interference: ITL stretch")


def user_rate_figure(rows: pd.DataFrame, *, figsize=None) -> Figure:
    """Tokens/s per decode user of the whole model (from the mean ITL; scaled from the layers timed where the
    rows say so) alone, co-located and protected against prompt length, a panel per decode batch, with the 3 and
    10 tok/s targets."""
    ok = spatial(rows[rows["status"] == "ok"]) if len(rows) else rows
    if not len(ok):
        return no_data("Interference: what each user sees", "no spatial rows with status 'ok'")
    fig, panels = _by_batch(ok, "tokens_per_s_per_user", figsize)
    for batch, ax in panels.items():
        for target, style in zip(USER_TARGETS, (":", "--"), strict=True):
            ax.axhline(target, color="0.4", linestyle=style, linewidth=1, gid="target", label=f"{target:g} tok/s")
        _prompt_axis(ax, ok)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_title(f"decode batch {batch}", fontsize="medium")
    bases = sorted(set(ok["whole_model"].fillna("").astype(str)) - {""})
    title = "Interference: what each user sees" + (f" ({'; '.join(bases)})" if bases else " (layers timed only)")
    return _finish(fig, panels, ok, "tokens/s per user of the whole model", title)


INTERFERENCE_FIGURES = {"interference_chunks": chunk_figure, "interference_stretch": stretch_figure,
                        "interference_users": user_rate_figure}


def drawn_figures(rows: pd.DataFrame) -> dict:
    """The figures of INTERFERENCE_FIGURES that the rows' forms call for (all of them for no rows)."""
    forms = {"hybrid": len(hybrid(rows)) > 0, "spatial": len(spatial(rows)) > 0}
    if not any(forms.values()):
        return dict(INTERFERENCE_FIGURES)
    return {name: draw for name, draw in INTERFERENCE_FIGURES.items()
            if forms["hybrid" if name == "interference_chunks" else "spatial"]}


def write_interference_figures(rows: pd.DataFrame, out_dir, *, dpi: int = 110) -> list[Path]:
    """The interference figures of the forms the rows hold (the chunk figure for hybrid rows, the others for spatial
    ones; all of them, saying there is no data, where there are no rows) as PNG files in out_dir, named as
    INTERFERENCE_FIGURES."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, draw in drawn_figures(rows).items():
        paths.append(out / f"{name}.png")
        save_png(draw(rows), paths[-1], dpi)
    return paths
