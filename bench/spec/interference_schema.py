"""The rows of `phasebench interference` (interference.csv): columns, their types, the modes (no torch)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .schema import coerce_columns

INTERFERENCE_SCHEMA = 2  # 2: device_name; covered is the share of the window (schema 1: a flag, read as blank)
CSV_NAME = "interference.csv"
RUN_JSON = "run.json"
# alone: the decode step by itself; colocated: beside a looped prefill of the same model on the same device;
# protected: co-located with the decode given priority (a high-priority stream) or reserved capacity (its own cores)
MODES = ("alone", "colocated", "protected")
# A co-located row whose prefill ran through less of a timed window than this understates the stretch: its reason
# says so, and the phase model does not use it.
COVERED_MIN = 0.95
# One row per (model, layers, dtype, batch, context, prompt, mode, mechanism) on one device.
KEY_COLUMNS = ("device", "model", "layers", "dtype", "batch", "context", "prompt", "mode", "mechanism")

INTERFERENCE_COLUMNS = (
    "run_id", "time", "device",
    "device_name",  # the device as result rows name it (the CPU or GPU model), for the phase model's lookup
    "device_kind", "model", "layers", "dtype",
    "batch",  # decode sequences, one new token each per step
    "context",  # tokens already in each decode sequence's KV cache
    "prompt",  # tokens of the prefill co-located with the decode (the same prompt length for the alone row)
    "mode", "mechanism",  # e.g. colocated / process, protected / disjoint cores or priority stream
    "decode_ms", "decode_p10_ms", "decode_p90_ms", "samples",  # the decode step, pooled over the rounds
    "stretch",  # decode_ms / decode_ms of the alone row of the same batch, context and prompt
    "p90_stretch",  # decode_p90_ms / the alone row's decode_p90_ms
    "tokens_per_s_per_user",  # 1000 / decode_ms: what each decode user sees
    "prefill_alone_ms",  # the prefill of `prompt` tokens by itself, as the co-runner times it
    "prefill_ms",  # the same prefill in this mode (alone for the alone row)
    "prefill_slowdown",  # prefill_ms / prefill_alone_ms
    "prefill_samples",  # prefill iterations wholly inside this mode's decode windows
    "covered",  # the share (0..1) of the timed window the prefill's iterations covered (the worst window)
    "decode_threads", "prefill_threads", "decode_cpus", "prefill_cpus",
    "rounds", "window_s",
    "others_cores",  # CPU used by processes other than ours and the co-runner, in cores (the worst window)
    "noisy", "noise_reason",  # something other than the co-runner competed for the device while sampling
    "status", "reason",  # ok, skipped, failed
)
INT_COLUMNS = ("layers", "batch", "context", "prompt", "samples", "prefill_samples", "decode_threads",
               "prefill_threads", "rounds")
FLOAT_COLUMNS = ("decode_ms", "decode_p10_ms", "decode_p90_ms", "stretch", "p90_stretch", "tokens_per_s_per_user",
                 "prefill_alone_ms", "prefill_ms", "prefill_slowdown", "covered", "window_s", "others_cores")
BOOL_COLUMNS = ("noisy",)
STRING_COLUMNS = tuple(c for c in INTERFERENCE_COLUMNS if c not in INT_COLUMNS + FLOAT_COLUMNS + BOOL_COLUMNS)
REQUIRED = ("batch", "context", "prompt", "mode", "mechanism", "status")  # the rest may be blank (a failed row)


def conform_interference(df: pd.DataFrame) -> pd.DataFrame:
    """Interference rows with every column, typed, in schema order (extras last); a ValueError names a bad or
    missing column."""
    missing = [name for name in REQUIRED if name not in df.columns]
    if missing:
        raise ValueError(f"missing interference column(s) {', '.join(missing)}")
    out = df.copy()
    if "covered" in out.columns and out["covered"].map(lambda v: str(v).lower() in ("true", "false")).any():
        out["covered"] = np.nan  # schema 1's flag was true on every path: no share is known
    for name in INTERFERENCE_COLUMNS:
        if name not in out.columns:
            out[name] = "" if name in STRING_COLUMNS else np.nan
    out = coerce_columns(out, strings=STRING_COLUMNS, ints=INT_COLUMNS, floats=FLOAT_COLUMNS, bools=BOOL_COLUMNS)
    out["noisy"] = out["noisy"].fillna(False)
    unknown = sorted(set(out["mode"]) - set(MODES))
    if unknown:
        raise ValueError(f"column 'mode' holds {unknown[0]!r}, not one of {', '.join(MODES)}")
    return out[list(INTERFERENCE_COLUMNS) + [c for c in out.columns if c not in INTERFERENCE_COLUMNS]]
