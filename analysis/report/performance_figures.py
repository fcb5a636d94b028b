"""The figures of result rows a report shows, drawn once per report (Context.performance_figures): the roofline,
the attention figures when the rows hold attention, the linear ones when they hold linear rows."""

from __future__ import annotations

import pandas as pd

from ..figures.kit import op_rows
from ..figures.linear import layer_tokens_per_second, linear_sweep
from ..figures.prefill_decode import phase_comparison, tokens_per_second
from ..figures.roofline import roofline
from ..figures.scaling import decode_scaling, prefill_scaling
from ..figures.speedup import speedup


def has_op(df: pd.DataFrame, op: str) -> bool:
    return not op_rows(df, op).empty


def figures(df: pd.DataFrame, *, datasheet: dict | None = None, baseline: str = "naive") -> dict:
    """Every figure of the rows by name (a name is also the PNG's file stem), roofline first: the attention
    figures when the frame holds attention rows, the linear ones when it holds linear rows."""
    found = {"roofline": roofline(df, datasheet=datasheet, legend="below")}
    if has_op(df, "attention") or not has_op(df, "linear"):
        found.update({
            "phase_comparison": phase_comparison(df),
            "tokens_per_second": tokens_per_second(df),
            "prefill_scaling": prefill_scaling(df),
            "decode_scaling": decode_scaling(df),
        })
    found["speedup"] = speedup(df, baseline=baseline)
    if has_op(df, "linear"):
        found["linear_sweep"] = linear_sweep(df)
        found["layer_tokens_per_second"] = layer_tokens_per_second(df)
    return found
