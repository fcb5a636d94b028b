"""How a comparison reads: the ratio figure with its intervals, the text table, the note and the report's tables."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from ...bench.spec.schema import cell_float, cell_true, key_text
from ..figures.kit import GROUP_FIELDS, new_figure, no_data
from .pairs import BY, SIDE_FIELDS, VERDICTS

__all__ = ["comparison_figure", "comparison_note", "comparison_tables", "format_comparison", "no_pair_hint",
           "pair_labels"]


def pair_labels(frame: pd.DataFrame) -> pd.Series:
    """Case labels with the key fields that vary among the rows (impl, device, mode, ...) appended."""
    extra = [name for name in ("op", "impl", "model", *GROUP_FIELDS) if name in frame.columns
             and frame[name].astype(str).nunique() > 1]
    if not extra:
        return frame["case"].astype(str)
    return frame.apply(lambda row: " · ".join([str(row["case"]), *(key_text(row[name]) for name in extra)]), axis=1)


def _sides_label(frame: pd.DataFrame, side: str) -> str:
    by = frame.attrs.get("by", "run")
    column = f"{side}_{BY[by]}" if by != "run" else f"{side}_run_id"
    values = sorted({key_text(v) for v in frame[column] if key_text(v)})
    shown = ", ".join(values[:3]) + (f" (+{len(values) - 3})" if len(values) > 3 else "")
    return f"{by} {shown}" if shown else by


def comparison_figure(frame: pd.DataFrame, *, figsize=None) -> Figure:
    """The ratio new/base per pair with its interval, sorted; the dashed lines are the threshold."""
    threshold = frame.attrs.get("threshold", 0.05)
    confidence = frame.attrs.get("confidence", 0.95)
    title = f"{_sides_label(frame, 'new')} against {_sides_label(frame, 'base')}" if len(frame) else "comparison"
    pairs = frame[frame["pairing"] == "pair"]
    if pairs.empty:
        return no_data(title, "no pair of the same measurement with status ok on both sides")
    pairs = pairs.assign(label=pair_labels(pairs)).sort_values("ratio", kind="stable").reset_index(drop=True)
    fig, axes = new_figure(figsize=figsize or (8.5, 1.6 + 0.3 * len(pairs)))
    ax = axes[0, 0]
    colors = {"faster": "#2ca02c", "slower": "#d62728", "within threshold": "0.45", "unresolved": "#ff7f0e"}
    y = np.arange(len(pairs))
    ratio = pairs["ratio"].to_numpy(dtype=float)
    low = pairs["ratio_lo"].to_numpy(dtype=float)
    high = pairs["ratio_hi"].to_numpy(dtype=float)
    for verdict, color in colors.items():
        pick = (pairs["verdict"] == verdict).to_numpy()
        if not pick.any():
            continue
        known = pick & np.isfinite(low)
        ax.errorbar(ratio[known], y[known], xerr=[ratio[known] - low[known], high[known] - ratio[known]], fmt="none",
                    ecolor=color, elinewidth=1.6, capsize=3, gid="interval")
        noisy = pairs["noisy"].to_numpy(dtype=bool)
        if (pick & ~noisy).any():
            ax.scatter(ratio[pick & ~noisy], y[pick & ~noisy], color=color, s=28, zorder=3, label=verdict,
                       gid="series")
        if (pick & noisy).any():
            ax.scatter(ratio[pick & noisy], y[pick & noisy], facecolors="none", edgecolors=color, s=28, zorder=3,
                       label=f"{verdict} (noisy)", gid="series")
    ax.axvline(1.0, color="0.3", linewidth=1)
    for edge in (1 + threshold, 1 / (1 + threshold)):
        ax.axvline(edge, color="0.5", linestyle="--", linewidth=0.9)
    ax.set_xscale("log")
    shown = np.concatenate([ratio, low[np.isfinite(low)], high[np.isfinite(high)], [1 / (1 + threshold), 1.1]])
    decades = math.log10(shown.max() / shown.min())
    subs = (1.0, 1.5, 2.0, 3.0, 5.0, 7.0) if decades < 1 else (1.0, 2.0, 5.0) if decades < 2.5 else (1.0,)
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.3g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_yticks(y, pairs["label"], fontsize="small")
    ax.set_ylim(-0.7, len(pairs) - 0.3)
    ax.set_xlabel("latency ratio new / base (log; above 1: slower)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title(f"{title}\n{confidence:.0%} intervals; dashed: ±{threshold:.0%} threshold", fontsize="medium")
    return fig


def _fmt(value, spec: str = ".3g") -> str:
    number = cell_float(value)
    return "–" if not math.isfinite(number) else format(number, spec)


def _both(row, name: str, spec: str) -> str:
    return f"{_fmt(row[f'base_{name}'], spec)} -> {_fmt(row[f'new_{name}'], spec)}"


def _noise_mark(row) -> str:
    sides = [side for side in ("base", "new") if cell_true(row[f"{side}_noisy"])]
    return "NOISY " + "+".join(sides) if sides else ""


def format_comparison(frame: pd.DataFrame) -> str:
    """The comparison as text: pairs (ratio, interval, verdict, both sides' figures), then the
    status changes and the unpaired rows, then a count line."""
    by = frame.attrs.get("by", "run")
    confidence = frame.attrs.get("confidence", 0.95)
    threshold = frame.attrs.get("threshold", 0.05)
    lines = [f"new: {_sides_label(frame, 'new')}", f"base: {_sides_label(frame, 'base')}"]
    pairs = frame[frame["pairing"] == "pair"]
    if not pairs.empty:
        table = pd.DataFrame({
            "case": pair_labels(pairs),
            "ratio": pairs["ratio"].map(lambda v: _fmt(v, ".3f")),
            f"{confidence:.0%} interval": [f"[{_fmt(lo, '.3f')}, {_fmt(hi, '.3f')}]"
                                            for lo, hi in zip(pairs["ratio_lo"], pairs["ratio_hi"], strict=True)],
            "verdict": pairs["verdict"],
            "latency ms": [_both(row, "latency_ms", ".3g") for _, row in pairs.iterrows()],
            "TFLOP/s": [_both(row, "tflops", ".3g") for _, row in pairs.iterrows()],
            "GB/s": [_both(row, "gbps", ".3g") for _, row in pairs.iterrows()],
            "% roof": [_both(row, "pct_roofline", ".3g") for _, row in pairs.iterrows()],
            "method": pairs["method"],
            "noisy": [_noise_mark(row) + (" interpreter" if row["interpreter"] else "") for _, row in pairs.iterrows()],
        })
        lines += ["", "pairs (ratio = new / base latency; figures base -> new):",
                  table.to_string(index=False, justify="left")]
    for kind, what in (("status change", "status changed"), ("base only", "only in base"), ("new only", "only in new")):
        part = frame[frame["pairing"] == kind]
        if part.empty:
            continue
        side = "new" if kind == "new only" else "base"
        table = pd.DataFrame({"case": pair_labels(part), "impl": part[f"{side}_impl"]})
        if kind == "status change":
            table["status"] = part["change"]
            table["reason"] = [row["new_reason"] or row["base_reason"] for _, row in part.iterrows()]
        else:
            table["status"] = part[f"{side}_status"]
            table["run"] = part[f"{side}_run_id"]
        lines += ["", f"{what} ({len(part)}):", table.to_string(index=False, justify="left")]
    hint = no_pair_hint(frame)
    if hint:
        lines += ["", hint]
    counts = {verdict: int((pairs["verdict"] == verdict).sum()) for verdict in VERDICTS}
    noisy = int(pairs["noisy"].astype(bool).sum())
    lines += ["", f"{len(pairs)} pairs by {by}: {counts['slower']} slower, {counts['faster']} faster, "
                  f"{counts['within threshold']} within {threshold:.0%}, {counts['unresolved']} unresolved "
                  f"({confidence:.0%} intervals"
                  f"{', ' + str(noisy) + ' noisy' if noisy else ''}); "
                  f"{int((frame['pairing'] == 'status change').sum())} status changes, "
                  f"{int((frame['pairing'] == 'base only').sum())} only in base, "
                  f"{int((frame['pairing'] == 'new only').sum())} only in new", *promise_lines(pairs, confidence, by)]
    return "\n".join(lines)


def promise_lines(pairs: pd.DataFrame, confidence: float, by: str = "run") -> list[str]:
    """Which interval each verdict judged and what it promises: pairs from rounds hold between runs (the same code run
    twice, or two impls of equal speed, are called slower or faster at most 1 - confidence of the time); the others
    within each run only (no promise between runs); and, comparing runs where the base rows carry one, how many new
    medians fell inside the base's between-run interval against the share its level promises."""
    if pairs.empty or "covers" not in pairs.columns:
        return []
    timed = pairs[~pairs["interpreter"].astype(bool)]
    between = int((timed["covers"] == "between runs").sum())
    same = "the same code" if by == "run" else f"two {BY[by].replace('_', ' ')}s of equal speed"
    lines = [f"judged on: {between} of {len(timed)} timed pairs with intervals between runs (rounds: Welch, or "
             f"paired within one run), which call {same} slower or faster at most {1 - confidence:.0%} of the time; "
             f"{len(timed) - between} within each run only (no promise between runs)"]
    inside = timed["in_base_between"].dropna() if "in_base_between" in timed.columns else pd.Series(dtype=object)
    if by == "run" and len(inside):
        lines.append(f"between-run coverage: {int(inside.astype(bool).sum())} of {len(inside)} new medians inside the "
                     f"base rows' 95% between-run intervals (a repeat of the same code: about 95%)")
    return lines


def no_pair_hint(frame: pd.DataFrame) -> str:
    """Why nothing paired, when the unpaired sides differ in a field that is part of the key."""
    base = frame[frame["pairing"] == "base only"]
    new = frame[frame["pairing"] == "new only"]
    if (frame["pairing"] == "pair").any() or base.empty or new.empty:
        return ""
    for name in ("timer", "device", "impl", "mode", "dtype"):
        column = f"{{}}_{name}" if name in SIDE_FIELDS else name
        left = {key_text(v) for v in base[column.format("base")]} if column.format("base") in base else set()
        right = {key_text(v) for v in new[column.format("new")]} if column.format("new") in new else set()
        if left and right and not left & right:
            way = f"; --by {name} compares across it" if name in BY and name != frame.attrs.get("by") else ""
            return (f"no pairs: the sides differ in {name} ({', '.join(sorted(left))} against "
                    f"{', '.join(sorted(right))}), which is part of what makes two rows the same measurement{way}")
    return ""


def comparison_note(frame: pd.DataFrame) -> str:
    """One paragraph: what was compared, how the intervals were made, the verdict rule and the counts."""
    threshold = frame.attrs.get("threshold", 0.05)
    confidence = frame.attrs.get("confidence", 0.95)
    pairs = frame[frame["pairing"] == "pair"]
    methods = ", ".join(f"{count} {method}" for method, count in pairs["method"].value_counts().items())
    return (f"New: {_sides_label(frame, 'new')}; base: {_sides_label(frame, 'base')}. Ratio = new / base median "
            f"latency with a {confidence:.0%} interval: from the medians of the rows' rounds where both were "
            "measured in rounds (Welch's t between two runs, paired t within one; these cover the drift between "
            "runs), else a percentile bootstrap of the raw samples where both sides "
            "kept them, else from the two rows' 95% intervals of their medians (row intervals), else a normal "
            "approximation from the p20/p80 (q1/q3 for pytest-benchmark) spread "
            f"({methods or 'no pairs'}). Slower: the interval's lower end above {1 + threshold:.3g}; faster: its "
            f"upper end below 1/{1 + threshold:.3g} = {1 / (1 + threshold):.3g}; within threshold: the whole "
            "interval between the two; unresolved: it straddles one of them, so the medians are not told apart. "
            "Intervals without rounds cover the spread within each run, not the drift between runs. Noisy pairs "
            "were timed while the device was contended.")


def comparison_tables(frame: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """{heading: table} for a report: the pairs with their figures, then the status changes and unpaired rows."""
    pairs = frame[frame["pairing"] == "pair"]
    tables = {"Pairs": pd.DataFrame({
        "case": pair_labels(pairs), "ratio": pairs["ratio"], "ratio_lo": pairs["ratio_lo"],
        "ratio_hi": pairs["ratio_hi"], "verdict": pairs["verdict"], "method": pairs["method"],
        "covers": pairs["covers"] if "covers" in pairs.columns else "",
        **{f"{side}_{name}": pairs[f"{side}_{name}"] for name in ("latency_ms", "tflops", "gbps", "pct_roofline")
           for side in ("base", "new")},
        "noisy": [_noise_mark(row).removeprefix("NOISY ") for _, row in pairs.iterrows()],
    })}
    for kind, heading in (("status change", "Status changes"), ("base only", "Only in base"),
                          ("new only", "Only in new")):
        part = frame[frame["pairing"] == kind]
        side = "new" if kind == "new only" else "base"
        table = pd.DataFrame({"case": pair_labels(part), "impl": part[f"{side}_impl"],
                              "status": part["change"] if kind == "status change" else part[f"{side}_status"],
                              "base_reason": part["base_reason"], "new_reason": part["new_reason"]})
        tables[heading] = table
    return tables
