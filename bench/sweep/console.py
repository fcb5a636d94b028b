"""Terminal output of a run: a progress bar on stderr and the closing table of rows."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pandas as pd

from ..spec.roof import COPY
from ..spec.schema import ABOVE_ROOF_PCT, cell_true


class Progress:
    """One line per finished row, led by a bar; redrawn in place on a terminal."""

    def __init__(self, stream=None, width: int = 20):
        self.stream = stream or sys.stderr
        self.width = width
        self.tty = getattr(self.stream, "isatty", lambda: False)()

    def __call__(self, row: dict, index: int, total: int) -> None:
        filled = self.width * index // max(total, 1)
        bar = "#" * filled + "-" * (self.width - filled)
        status = row["status"] if row["status"] != "ok" else f"{row['latency_ms']:.3f} ms{_half_width(row)}"
        if row.get("noisy"):
            status += " NOISY"
        if cell_true(row.get("drifting")):
            status += " DRIFTING"
        text = f"[{bar}] {index}/{total} {row['op']:<9} {row['impl']:<8} {row['phase']:<15} {row['shape']}  {status}"
        if row.get("round"):
            text += f"  (round {row['round']})"
        if self.tty:
            end = "\n" if index == total else ""
            self.stream.write("\r" + text.ljust(100)[:100] + end)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


def _num(value, fmt: str) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, fmt)


def _get(row, name: str):
    return row.get(name) if hasattr(row, "get") else getattr(row, name, None)


def spread_text(low, high, median) -> str:
    """An interval around `median` in a few characters: '±1.2%' (its longer arm over the median) while that is under
    20%; '×/÷1.8' (the square root of high over low: the interval is about median ÷ 1.8 to median × 1.8) past it, as
    a wide interval of a latency is nearer symmetric in log space; '' without one."""
    try:
        low, high, median = float(low), float(high), float(median)
    except (TypeError, ValueError):
        return ""
    if not (math.isfinite(low) and math.isfinite(high) and low > 0 and median > 0):
        return ""
    rel = max(high - median, median - low) / median  # the longer arm: a log-symmetric interval's upper one
    return f"±{100 * rel:.1f}%" if rel < 0.2 else f"×/÷{math.sqrt(high / low):.2g}"


def _half_width(row) -> str:
    """' ±1.2%' or ' ×/÷1.8' (the 95% interval of the row's latency, spread_text), '*' after it where sampling stopped
    short of its target."""
    found = spread_text(_get(row, "latency_ci_low_ms"), _get(row, "latency_ci_high_ms"), _get(row, "latency_ms"))
    converged = _get(row, "converged")
    if not found:
        return ""
    return f" {found}" + ("" if converged is not None and not pd.isna(converged) and converged else "*")


def _between(row) -> str:
    """The interval a repeat of the run lands in (its rounds, spread_text), blank without rounds."""
    return spread_text(_get(row, "latency_between_low_ms"), _get(row, "latency_between_high_ms"),
                       _get(row, "latency_ms"))


def format_table(df: pd.DataFrame) -> str:
    """Per row: impl, phase, shape, latency with the 95% interval of its median (its half-width, '*' where sampling
    stopped at a limit short of the target), the interval a repeat of the run lands in (`next run`, from its rounds)
    and sample count, TFLOP/s, GB/s, % of roofline, bound, status (NOISY, DRIFTING where sampling stopped at a limit
    with the halves of its samples disagreeing, ABOVE ROOF)."""
    if df.empty:
        return "(no rows)"
    lines = []
    for r in df.itertuples(index=False):
        shape = f"{r.shape} {r.dtype}"
        status = "" if r.status == "ok" else f"{r.status}: {r.reason}"[:70]
        if getattr(r, "noisy", False) is True:
            status = ("NOISY " + status).strip()
        if cell_true(getattr(r, "drifting", False)):  # a loaded frame's flag is numpy's bool
            status = ("DRIFTING " + status).strip()
        if getattr(r, "above_roof", False) is True:
            status = ("ABOVE ROOF " + status).strip()
        low, high = getattr(r, "latency_ci_low_ms", math.nan), getattr(r, "latency_ci_high_ms", math.nan)
        interval = "" if r.status != "ok" or pd.isna(low) else f"{_num(low, '.3f')}-{_num(high, '.3f')}"
        lines.append({"op": r.op, "impl": r.impl, "phase": r.phase, "shape": shape,
                      "latency ms": _num(r.latency_ms, ".3f"), "95% CI ms": interval,
                      "±": _half_width(r).strip() if r.status == "ok" else "",
                      "next run": _between(r) if r.status == "ok" else "",
                      "n": r.samples if r.status == "ok" else "",
                      "TFLOP/s": _num(r.tflops, ".3f"), "GB/s": _num(r.gbps, ".1f"),
                      "% roof": _num(r.pct_roofline, ".1f"), "bound": r.bound, "mode": r.mode, "status": status})
    return pd.DataFrame(lines).to_string(index=False)


def closing_lines(df: pd.DataFrame, out) -> list[str]:
    """The status counts, where the files are, and a warning when rows were timed on a contended device."""
    from ..instruments.contention import summary_warning

    counts = df["status"].value_counts().to_dict() if not df.empty else {}
    lines = [f"\nrows: {', '.join(f'{v} {k}' for k, v in counts.items()) or 'none'}; "
             f"results in {out}/results.csv, results.parquet, run.json"]
    warning = summary_warning(df) if not df.empty else None
    if warning:
        lines.append(f"warning: {warning}")
    lines += _unconverged(df) + _drifting(df)
    lines += _between_runs(df)
    above = df[df["above_roof"].astype(bool)] if "above_roof" in df.columns and not df.empty else df.iloc[0:0]
    if len(above):
        example = above.iloc[0]
        lines.append(f"warning: {len(above)} of {int((df['status'] == 'ok').sum())} ok rows stand above "
                     f"{ABOVE_ROOF_PCT:g}% of their measured roof (findings: drawn hollow in the figures, out of the "
                     f"medians), e.g. {example['impl']} {example['shape']}: "
                     f"{str(example['reason']).removeprefix('above roof: ')}")
    lines += _level_notes(df)
    try:  # the ceilings measured again after the run: a drift names the figures that moved
        lines += [f"warning: {w}" for w in json.loads((Path(out) / "run.json").read_text()).get("ceiling_warnings", [])]
    except (OSError, ValueError, AttributeError):
        pass
    copied = df[df["roof_model"] == COPY] if "roof_model" in df.columns and not df.empty else df.iloc[0:0]
    if len(copied):
        ops = ", ".join(sorted(set(copied["op"].astype(str))))
        lines.append(f"note: {len(copied)} rows ({ops}) have the copy roof (all their bytes at the copy bandwidth): "
                     "their cost model gives no read/write split")
    return lines


def _between_runs(df: pd.DataFrame) -> list[str]:
    """A note on the rows' rounds: how many rows carry the interval a repeat of the run lands in, the widest, and the
    roof verdicts that the run's moving ceilings leave unresolved."""
    if df.empty or "latency_between_rel" not in df.columns:
        return []
    timed = df[(df["status"] == "ok") & (df["mode"] == "compiled")]
    rel = pd.to_numeric(timed["latency_between_rel"], errors="coerce")
    lines = []
    if rel.notna().any():
        widest = timed.loc[rel.idxmax()]
        rounds = pd.to_numeric(timed["rounds"], errors="coerce").dropna()
        lines.append(f"note: {int(rel.notna().sum())} of {len(timed)} timed rows carry the 95% interval a repeat of "
                     f"this run lands in ('next run', from {int(rounds.min())}-{int(rounds.max())} rounds in worker "
                     f"processes of their own); the widest {_between(widest)}, "
                     f"{widest['impl']} {widest['shape']} (rounds {widest['round_latencies_ms']} ms): compare runs "
                     "with `phasebench compare`, which judges them on these")
    if "roof_verdict" in timed.columns:
        open_ = timed[timed["roof_verdict"] == "unresolved"]
        if len(open_):
            lines.append(f"note: {len(open_)} of {len(timed)} timed rows are unresolved against their roof (their "
                         "intervals and the ceilings measured around their rounds straddle 100%: pct_roof_low, "
                         "pct_roof_high)")
    return lines


def _level_notes(df: pd.DataFrame) -> list[str]:
    """A warning per cache level whose warm rows are judged at a farther level's figure (their level_note)."""
    if df.empty or "level_note" not in df.columns:
        return []
    noted = df[df["level_note"].fillna("").astype(str) != ""]
    return [f"warning: {len(rows)} warm rows read from the {level} are judged at a farther level's figure, the "
            f"{level}'s own measured below it: {note}" for (level, note), rows in noted.groupby(["roof_level",
                                                                                                "level_note"])]


def _timed(df: pd.DataFrame) -> pd.DataFrame:
    return df[(df["status"] == "ok") & (df["mode"] == "compiled")]


def _drifted(rows: pd.DataFrame) -> pd.Series:
    if "drifting" not in rows.columns:  # a file written before the column: none was flagged
        return pd.Series(False, index=rows.index)
    return rows["drifting"].astype("boolean").fillna(False).astype(bool)


def _unconverged(df: pd.DataFrame) -> list[str]:
    """A note on the compiled ok rows whose interval stayed wider than the target at a limit (the '*'), drifting
    rows aside (their own warning)."""
    if df.empty or "converged" not in df.columns:
        return []
    timed = _timed(df)
    short = timed[~timed["converged"].astype("boolean").fillna(True) & ~_drifted(timed)]
    if short.empty:
        return []
    rounds = pd.to_numeric(short.get("rounds", pd.Series(dtype=float)), errors="coerce").fillna(1)
    if (rounds > 1).any():  # their interval is the rounds'; the target is each round's sampling
        return [f"note: {len(short)} of {len(timed)} timed rows had a round stop at its time or sample limit with the "
                "95% interval of that round's median wider than its target ('*'): --sample-time S gives them longer"]
    widest = short.loc[short["latency_ci_rel"].astype(float).fillna(float("inf")).idxmax()]
    return [f"note: {len(short)} of {len(timed)} timed rows stopped at their time or sample limit with the 95% "
            f"interval of their median wider than its target ('*'; the widest "
            f"±{100 * float(widest['latency_ci_rel']):.1f}%, {widest['impl']} {widest['shape']}): --sample-time S "
            "gives them longer"]


def _drifting(df: pd.DataFrame) -> list[str]:
    """A warning on the compiled ok rows whose samples drifted: stopped at a limit with the 95% intervals of the
    medians of their first and second half disjoint (DRIFTING), the one whose halves differ most as the example."""
    if df.empty or "drifting" not in df.columns:
        return []
    timed = _timed(df)
    drifted = timed[_drifted(timed)]
    if drifted.empty:
        return []
    first, second = drifted["first_half_ms"].astype(float), drifted["second_half_ms"].astype(float)
    example = drifted.loc[(second / first - 1).abs().fillna(0).idxmax()]
    return [f"warning: {len(drifted)} of {len(timed)} timed rows were drifting (DRIFTING: the medians of the first "
            f"and the second half of their samples disagree), e.g. {example['impl']} {example['shape']}: "
            f"{float(example['first_half_ms']):.3f} ms then {float(example['second_half_ms']):.3f} ms. Their latency "
            "moved while they were sampled: re-run those cases on a quiet machine"]
