"""Speculative decoding's figures and summary from a `phasebench phases --speculate` folder: speedup against α per γ
with the 1x line and the break-even points, the best γ per α, and the check against the real loop."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ..figures.kit import SERIES_GID, draw_bars, floats, new_figure, no_data, optional
from .figures import _heading, _number, _text, with_ends, write_phase_figures
from .folder import as_bool
from .speculative import best_gammas, break_evens, expected_tokens

BREAK_EVEN_GID = "break_even"  # the break-even points (tests find them)


def _table(tables: dict, name: str) -> pd.DataFrame | None:
    table = tables.get(name)
    return table if table is not None and len(table) else None


def _alpha_grid(alphas) -> np.ndarray:
    low, high = min(min(alphas), 0.3), max(max(alphas), 0.95)
    return np.linspace(low, high, 60)


def speculative_figure(tables: dict, *, figsize=None) -> Figure:
    """Speedup over plain decode against α, one line per γ (the measured steps with E(α, γ) between the measured
    α), one panel per batch; the 1x line and each γ's break-even α marked on it."""
    table = _table(tables, "speculative")
    if table is None:
        return no_data("Speculative decoding", "no speculative.csv (phasebench phases --speculate)")
    batches = sorted(table["batch"].unique())
    fig, axes = new_figure(1, len(batches), figsize=figsize, sharey=True)
    for ax, batch in zip(axes[0], batches, strict=True):
        rows = table[table["batch"] == batch]
        grid = _alpha_grid(rows["alpha"])
        for k, (gamma, group) in enumerate(rows.groupby("gamma")):
            first = group.iloc[0]
            draft, verify, tpot = (float(first[c]) for c in ("draft_step_ms", "verify_ms", "tpot_ms"))
            if not np.isfinite(draft + verify + tpot):
                continue
            curve = [expected_tokens(float(a), int(gamma)) * tpot / (gamma * draft + verify) for a in grid]
            (line,) = ax.plot(grid, curve, color=f"C{k}", label=f"γ = {gamma}")
            ax.plot(group["alpha"], floats(group["speedup"]), "o", color=line.get_color(), gid=SERIES_GID)
            draw_bars(ax, floats(group["alpha"]), floats(group["speedup"]), optional(group, "speedup_low"),
                      optional(group, "speedup_high"), line.get_color())
            even = float(first["break_even_alpha"])
            if np.isfinite(even):
                ax.plot([even], [1.0], "D", color=line.get_color(), markeredgecolor="k", gid=BREAK_EVEN_GID)
        ax.axhline(1.0, color="0.3", lw=1, ls="--", label="1x (plain decode)")
        ax.set_xlabel("acceptance rate α")
        ax.set_title(f"batch {batch}")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("speedup over plain decode")
    axes[0][-1].legend(fontsize=8)
    padded = ", ".join(sorted({f"{b}→{p}" for b, p in zip(table["batch"], table.get("plain_padded_to", table["batch"]),
                                                           strict=True) if str(p) not in ("", "nan", str(b))}))
    fig.suptitle(f"{_heading(tables, 'speculative decoding')}\n(diamonds: break-even α; dots: the α composed, bars "
                 "their 95% interval; plain decode at the fastest batch a server could pad to"
                 + (f": {padded}" if padded else "") + ")", fontsize=9)
    return fig


def best_gamma_figure(tables: dict, *, figsize=(6.0, 4.0)) -> Figure:
    """The best γ per α, one line per batch, its speedup written beside each point."""
    table = _table(tables, "speculative")
    if table is None:
        return no_data("Best γ per α", "no speculative.csv (phasebench phases --speculate)")
    best = best_gammas(table.assign(best_gamma=table["best_gamma"].map(as_bool)))
    fig, axes = new_figure(figsize=figsize)
    ax = axes[0][0]
    for k, (batch, rows) in enumerate(best.groupby("batch")):
        ax.plot(rows["alpha"], rows["gamma"], "o-", color=f"C{k}", label=f"batch {batch}", gid=SERIES_GID)
        for row in rows.itertuples():
            ax.annotate(f"{row.speedup:.2f}x", (row.alpha, row.gamma), textcoords="offset points", xytext=(4, 4),
                        fontsize=7)
    ax.set_yscale("log", base=2)
    gammas = sorted(table["gamma"].unique())
    ax.set_yticks(gammas, [str(g) for g in gammas])
    ax.set_xlabel("acceptance rate α")
    ax.set_ylabel("best γ (most tokens/s)")
    if len(best):
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no composed point (every step lacks a quiet op row)", ha="center", transform=ax.transAxes)
    ax.grid(alpha=0.3)
    ax.set_title(_heading(tables, "best draft length"), fontsize=9)
    return fig


def speculative_summary(tables: dict) -> str:
    """What `phases --speculate` prints: the best γ and its speedup per batch and α, the break-even α per γ, and
    the composition against the real loop (over the goal flagged)."""
    table = _table(tables, "speculative")
    if table is None:
        return ""
    table = table.assign(best_gamma=table["best_gamma"].map(as_bool))
    meta = (tables.get("meta") or {}).get("speculate") or {}
    draft = (meta.get("draft") or {}).get("name", "the draft")
    best = best_gammas(table)
    out = ["", f"Speculative decoding with {draft} at context {_number(table['context'].iloc[0])}: best γ per α "
               "(plain decode and the passes at the fastest shape a server could pad to; [95% interval]; E: tokens "
               "per pass, what a verify no faster than plain decode caps the speedup at)",
           _text(with_ends(best, "speedup"), ("batch", "alpha", "gamma", "tokens_per_s_per_user", "speedup",
                                              "expected_tokens_per_pass", "plain_padded_to", "verify_padded_to",
                                              "exceeds_e")),
           "", "Break-even α per γ (speculation pays above it; – never):",
           _text(break_evens(table), ("batch", "gamma", "break_even_alpha", "draft_step_ms", "verify_ms", "tpot_ms",
                                      "iteration_in_tpot"))]
    check = _table(tables, "speculative_check")
    if check is not None:
        shown = with_ends(check, "published_error_pct", "per_layer_error_pct", "speedup_error_pct")
        out += ["", f"Against a real speculative loop ({_number(check['layers'].iloc[0])}-layer target, "
                    f"{_number(check['draft_layers'].iloc[0])}-layer draft, and twice as deep for the per-layer error; "
                    f"goal ±{_number(check['goal_pct'].iloc[0])}%; errors composed / loop - 1, < 0: the composition is "
                    "faster (the speedup's: it promises less); realised_z: realised tokens per iteration against E in "
                    "standard errors):",
                _text(shown, ("batch", "gamma", "alpha", "published_error_pct", "error_pct", "per_layer_error_pct",
                              "composed_speedup", "loop_speedup", "speedup_error_pct", "realised_z", "verdict"))]
        out += [f"OVER GOAL: batch {r['batch']} γ {r['gamma']} α {r['alpha']:g}" for r in check.to_dict("records")
                if as_bool(r["over_goal"])]
    layers = (tables.get("meta") or {}).get("model", {}).get("layers", "all")
    out.append(f"Not checked: the speedups above are composed at the model's {layers} layers and at padded shapes; the "
               "loop checks its cut models at their own shapes (speedup_error_pct, for rows with loop_shapes).")
    return "\n".join(out)


SPECULATIVE_FIGURES = {"phases_speculative": speculative_figure, "phases_best_gamma": best_gamma_figure}


def write_speculative_figures(tables: dict, out_dir, *, dpi: int = 110) -> list[Path]:
    """The speculative figures as PNG files in out_dir (none without speculative.csv)."""
    if _table(tables, "speculative") is None:
        return []
    return write_phase_figures(tables, out_dir, dpi=dpi, figures=SPECULATIVE_FIGURES)
