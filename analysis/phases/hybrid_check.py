"""The composed hybrid iteration (a chunk of a prompt beside the decode users) against the one `phasebench
interference` timed as a real forward pass: the decode users' mean ITL and the prompt's TTFT, per (batch, prompt,
chunk)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...bench.spec import steps as step_defs
from ...bench.spec.models import DecoderConfig
from .check import goal_pct
from .model import Measured, model_error, sequence_items, step_time

COLUMNS = ("batch", "prompt", "context", "chunk", "iterations", "measured_itl_mean_ms", "composed_itl_ms",
           "itl_error_pct", "measured_ttft_ms", "composed_ttft_ms", "ttft_error_pct", "goal_pct", "checked",
           "over_goal", "missing", "noisy_left_out", "measured_run")


def hybrid_rows(interference: pd.DataFrame | None, *, model: str, dtype: str, device: str,
                layers: int) -> pd.DataFrame:
    """The ok, quiet hybrid rows of this model and dtype, measured on `device` (as result rows name it) with all of
    the composition's `layers` (a timed stretch of fewer layers is another model); each run's rows once (a
    folder given twice counts once; two runs of one (batch, prompt, context, chunk) are each checked, so that the
    error is read beside the drift between runs)."""
    if interference is None or not len(interference) or "chunk_tokens" not in interference:
        return pd.DataFrame()
    names = interference["device_name"].fillna("").astype(str)
    counts = pd.to_numeric(interference["layers"], errors="coerce")
    keep = ((interference["status"] == "ok") & (interference["mode"] == "hybrid")
            & (interference["model"] == model) & (interference["dtype"] == dtype) & (names == device)
            & (counts == layers) & interference["chunk_tokens"].notna())
    if "noisy" in interference:
        keep &= ~interference["noisy"].fillna(False).astype(bool)
    rows = interference[keep]
    run = rows["run_id"].fillna("").astype(str) if "run_id" in rows else pd.Series("", index=rows.index)
    return rows.assign(run_id=run).drop_duplicates(["batch", "prompt", "context", "chunk", "run_id"], keep="last")


def steps_of(config: DecoderConfig, row, page_size: int = 0) -> list[list[step_defs.OpUse]]:
    """The iterations of one hybrid row, as the phase model composes them (`whole`: one chunk of the prompt)."""
    return step_defs.chunked_prefill_steps(config, int(row["prompt"]), int(row["chunk_tokens"]), int(row["batch"]),
                                           int(row["context"]), page_size)


def hybrid_steps(config: DecoderConfig, rows: pd.DataFrame, page_size: int = 0) -> list[list[step_defs.OpUse]]:
    """Every iteration the check composes, so that each op it needs is measured."""
    return [step for _, row in rows.iterrows() for step in steps_of(config, row, page_size)]


def hybrid_check(measured: Measured, config: DecoderConfig, rows: pd.DataFrame, page_size: int = 0) -> pd.DataFrame:
    """Per measured hybrid row: its mean ITL and TTFT against the composition of the same iterations from the
    op rows, and the error in percent. `checked` only where every op of every iteration was measured and no
    sequence term was left out as noisy (that makes the sum too low); `over_goal` where unchecked or past the goal
    of the row's device kind. Every arrival has the same iterations, so the two errors differ only by the mean of the
    iterations against the median of the arrivals: one check, read two ways."""
    out = []
    for _, row in rows.iterrows():
        goal = goal_pct(row.get("device_kind", "cpu"))
        steps = steps_of(config, row, page_size)
        times = [step_time(measured, s) for s in steps]
        composed = np.array([t.total_ms for t in times])
        itl, ttft = float(row["itl_mean_ms"]), float(row["ttft_ms"])
        errors = (model_error(float(composed.mean()), itl), model_error(float(composed.sum()), ttft))
        missing, noisy = sum(len(t.missing) for t in times), sum(t.noisy for t in times)
        # a noisy op row beside a quiet one costs nothing; a sequence term left out makes the sum too low
        dropped = sum(sequence_items(measured, step_defs.with_weights(s, measured.weights))[1] for s in steps)
        checked = not missing and not dropped and all(np.isfinite(errors))
        out.append({"batch": int(row["batch"]), "prompt": int(row["prompt"]), "context": int(row["context"]),
                    "chunk": str(row["chunk"]), "iterations": len(times), "measured_itl_mean_ms": itl,
                    "composed_itl_ms": float(composed.mean()), "itl_error_pct": errors[0],
                    "measured_ttft_ms": ttft, "composed_ttft_ms": float(composed.sum()), "ttft_error_pct": errors[1],
                    "goal_pct": goal, "checked": checked,
                    "over_goal": not (checked and all(abs(e) <= goal for e in errors)), "missing": missing,
                    "noisy_left_out": noisy, "measured_run": str(row.get("run_id", ""))})
    return pd.DataFrame(out, columns=list(COLUMNS))
