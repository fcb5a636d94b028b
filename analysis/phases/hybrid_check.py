"""The composed hybrid iteration (a chunk of a prompt beside the decode users) against the one `phasebench
interference` timed as a real forward pass, through the layers that row timed: the arrival's TTFT (the sum of its
iterations) and, apart from it, the slowest iteration position, each with its interval and a verdict; and the
published chunked table's rows given the verdict of the measured rows of their own shape."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from ...bench.spec import steps as step_defs
from ...bench.spec.interval import worst_verdict
from ...bench.spec.models import DecoderConfig
from .check import VERDICT_WORDS, error_columns, goal_pct, pct_interval
from .model import Measured, composed_interval, step_time

NOT_CHECKED = "no quiet hybrid row of this shape"  # none measured at it, or only noisy or failed ones
FIGURES = ("ttft", "slowest")  # the arrival's sum of iterations; its slowest iteration position (not the same sum)
COLUMNS = ("batch", "prompt", "context", "chunk", "layers", "iterations", "arrivals",
           *(f"{side}_{f}{end}" for f in FIGURES for side in ("measured", "composed")
             for end in ("_ms", "_low_ms", "_high_ms")),
           *(f"{f}_{c}" for f in FIGURES for c in ("error_pct", "error_low_pct", "error_high_pct", "verdict")),
           "verdict", "goal_pct", "checked", "over_goal", "missing", "noisy_left_out", "measured_run", "iteration_ms")


def hybrid_rows(interference: pd.DataFrame | None, *, model: str, dtype: str, device: str, quiet: bool = True,
                layers: int) -> pd.DataFrame:
    """The ok, quiet hybrid rows of this model and dtype, measured on `device` (as result rows name it) through any
    number of its `layers` (each is checked against the model cut to the layers it timed, so that a GPU row of a
    few layers is checked too); each run's rows once (a folder given twice counts once; two runs of one (batch,
    prompt, context, chunk, layers) are each checked, so that the error is read beside the drift between runs)."""
    if interference is None or not len(interference) or "chunk_tokens" not in interference:
        return pd.DataFrame()
    names = interference["device_name"].fillna("").astype(str)
    counts = pd.to_numeric(interference["layers"], errors="coerce")
    keep = ((interference["status"] == "ok") & (interference["mode"] == "hybrid")
            & (interference["model"] == model) & (interference["dtype"] == dtype) & (names == device)
            & (counts >= 1) & (counts <= layers) & interference["chunk_tokens"].notna())
    if quiet and "noisy" in interference:  # with quiet=False: the noisy ones too (to count what was left out)
        keep &= ~interference["noisy"].fillna(False).astype(bool)
    rows = interference[keep]
    run = rows["run_id"].fillna("").astype(str) if "run_id" in rows else pd.Series("", index=rows.index)
    return rows.assign(run_id=run).drop_duplicates(["batch", "prompt", "context", "chunk", "layers", "run_id"],
                                                   keep="last")


def cut(config: DecoderConfig, row) -> DecoderConfig:
    """The model cut to the layers the row timed."""
    return dataclasses.replace(config, layers=int(row["layers"]))


def steps_of(config: DecoderConfig, row, page_size: int = 0) -> list[list[step_defs.OpUse]]:
    """The iterations of one hybrid row, as the phase model composes them through the row's layers (`whole`: one
    chunk of the prompt)."""
    return step_defs.chunked_prefill_steps(cut(config, row), int(row["prompt"]), int(row["chunk_tokens"]),
                                           int(row["batch"]), int(row["context"]), page_size)


def hybrid_steps(config: DecoderConfig, rows: pd.DataFrame, page_size: int = 0) -> list[list[step_defs.OpUse]]:
    """Every iteration the check composes, so that each op it needs is measured."""
    return [step for _, row in rows.iterrows() for step in steps_of(config, row, page_size)]


def _measured(row, stem: str) -> tuple[float, float, float]:
    """(value, low, high) of a measured figure; rows of interference schema 3 carry no interval (NaN ends)."""
    return tuple(float(row[c]) if c in row and pd.notna(row[c]) else np.nan
                 for c in (f"{stem}_ms", f"{stem}_low_ms", f"{stem}_high_ms"))


def chunk_label(value) -> str:
    """A chunk as the check keys it: "64" for 64, 64.0 (a row read back as floats) and "64"; "whole" as it is."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return str(int(number)) if np.isfinite(number) and number == int(number) else str(value)


def hybrid_check(measured: Measured, config: DecoderConfig, rows: pd.DataFrame, page_size: int = 0) -> pd.DataFrame:
    """Per measured hybrid row, through the layers it timed: its TTFT (median of arrivals) against the composed sum
    of the same iterations, and its slowest iteration position against the slowest composed iteration (a figure of
    its own: not the sum read again), each error (composed / measured - 1, < 0: the composition is faster) with its
    interval and within / over / unresolved on the goal of the row's device kind; `verdict` the worse of the two.
    `checked` only where every op of every iteration was measured; an unchecked row is unresolved. Where the row
    timed its arrivals through no layer too (zero_layer_ttft_ms), what an iteration costs beyond its layers is that,
    less the composed heads (`iteration_ms`, per arrival), added to both figures."""
    out = []
    for _, row in rows.iterrows():
        goal = goal_pct(row.get("device_kind", "cpu"))
        steps = steps_of(config, row, page_size)
        times = [step_time(measured, s) for s in steps]
        missing, noisy = sum(len(t.missing) for t in times), sum(t.noisy for t in times)
        composed = {"ttft": composed_interval(*(t.items for t in times)) if not missing else (np.nan,) * 3,
                    "slowest": max((t.interval for t in times), key=lambda t: t[0]) if not missing
                    else (np.nan,) * 3}
        # what an iteration costs beyond its layers, measured (the arrival through no layer) where the row has it:
        # the composed heads replaced by it, once per iteration
        extra = {"ttft": float(row.get("zero_layer_ttft_ms", np.nan)) - sum(t.parts["head"] for t in times),
                 "slowest": float(row.get("zero_layer_slowest_ms", np.nan))
                 - max(times, key=lambda t: t.total_ms).parts["head"] if times else np.nan}
        for figure, add in extra.items():
            if np.isfinite(add) and not missing:
                composed[figure] = tuple(v + add for v in composed[figure])
        found = {"ttft": _measured(row, "ttft"), "slowest": _measured(row, "itl_position_max")}
        checked = not missing and np.isfinite(composed["ttft"][0])
        line = {"batch": int(row["batch"]), "prompt": int(row["prompt"]), "context": int(row["context"]),
                "chunk": chunk_label(row["chunk"]), "layers": int(row["layers"]), "iterations": len(times),
                "arrivals": row.get("arrivals", np.nan), "goal_pct": goal, "checked": checked, "missing": missing,
                "noisy_left_out": noisy, "measured_run": str(row.get("run_id", "")),
                "iteration_ms": extra["ttft"] if np.isfinite(extra["ttft"]) else np.nan}
        for figure in FIGURES:
            for side, value in (("measured", found[figure]), ("composed", composed[figure])):
                line.update(dict(zip((f"{side}_{figure}{e}" for e in ("_ms", "_low_ms", "_high_ms")), value,
                                     strict=True)))
            line.update(error_columns(figure, composed[figure], found[figure], goal))
            if not checked:
                line[f"{figure}_verdict"] = "unresolved"
        line["verdict"] = worst_verdict(line[f"{f}_verdict"] for f in FIGURES)
        line["over_goal"] = line["verdict"] == "over"
        out.append(line)
    return pd.DataFrame(out, columns=list(COLUMNS))


CHUNKED_CHECK = ("check_verdict", "check_ttft_error_pct", "check_ttft_error_low_pct", "check_ttft_error_high_pct",
                 "check_run", "check_rows")
_RANK = {"over": 0, "unresolved": 1, "within": 2}  # the row that gives the verdict: the worst, then the largest error


def chunked_verdicts(chunked: pd.DataFrame, check: pd.DataFrame) -> pd.DataFrame:
    """The published chunked table with the check of its own rows: per (chunk, prompt, decode batch, context) the
    measured hybrid rows of that shape (any layer count, any run), their worst verdict (`check_verdict`; NOT_CHECKED
    where no ok, quiet row of that shape was given) and the row that gives it, the worst and then the largest |TTFT
    error|: its TTFT error with its interval and its run (`check_ttft_error_*`, `check_run`; `check_rows` counts
    the rows of the shape), so that the error shown is the one judged."""
    out = chunked.copy()
    found = {name: [] for name in CHUNKED_CHECK}
    for _, row in chunked.iterrows():
        mine = check[(check["batch"] == row["decode_batch"]) & (check["prompt"] == row["prompt"])
                     & (check["context"] == row["context"])
                     & (check["chunk"].map(chunk_label) == chunk_label(row["chunk"]))] \
            if len(check) else check
        if len(mine):
            order = mine.assign(_rank=mine["verdict"].map(_RANK).fillna(1),
                                _size=-pd.to_numeric(mine["ttft_error_pct"], errors="coerce").abs())
            worst = order.sort_values(["_rank", "_size"], kind="stable", na_position="last").iloc[0]
            values = (worst_verdict(mine["verdict"]), *(float(worst.get(f"ttft_error{end}_pct", np.nan))
                                                          for end in ("", "_low", "_high")),
                      str(worst.get("measured_run", "")), len(mine))
        else:
            values = (NOT_CHECKED, np.nan, np.nan, np.nan, "", 0)
        for name, value in zip(CHUNKED_CHECK, values, strict=True):
            found[name].append(value)
    return out.assign(**found)


def hybrid_lines(table: pd.DataFrame | None) -> list[str]:
    """What the summary prints of the hybrid check: one line per measured row, its TTFT error and its slowest
    iteration's, each with its interval, and the verdict."""
    if table is None or not len(table):
        return []
    out = ["", "Hybrid iterations against `phasebench interference`'s, through the layers each row timed (< 0: the "
               "composition is faster; [95% interval]; TTFT: the arrival's iterations summed; slowest: its slowest "
               "iteration position):"]
    for _, row in table.iterrows():
        errors = "; ".join(f"{name} {_error(row, f)}" for f, name in (("ttft", "TTFT"), ("slowest", "slowest "
                                                                                             "iteration"))
                           if f"{f}_error_pct" in row)
        state = VERDICT_WORDS.get(str(row.get("verdict", "")), "OVER GOAL" if row["over_goal"] else "within goal")
        unchecked = "" if row["checked"] else f" (not checked: {int(row['missing'])} ops missing, " \
                                              f"{int(row['noisy_left_out'])} noisy left out)"
        out.append(f"  batch {int(row['batch'])} prompt {int(row['prompt'])} chunk {row['chunk']} "
                   f"({_layers(row)}): {errors}: {state}{unchecked}")
    return out


def _error(row, figure: str) -> str:
    return pct_interval(*(float(row.get(f"{figure}_{c}", np.nan)) for c in ("error_pct", "error_low_pct",
                                                                             "error_high_pct")))


def _layers(row) -> str:
    return f"{int(row['layers'])} layers" if "layers" in row and pd.notna(row["layers"]) else "all layers"
