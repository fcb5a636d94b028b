"""The rows of `phasebench interference` (interference.csv): columns, their types, the modes (no torch)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .schema import coerce_columns

# 2: device_name; covered is the share of the window (schema 1: a flag, read as blank). 3: the hybrid iteration's
# rows (mode hybrid, chunk), the ITL's mean and tail on every row, whole-model per-user figures (older: blank).
# 4: percentiles blank where the samples do not support them, itl_tail_ms / itl_tail ("p99" or "max of N"); hybrid
# rows: TTFT's interval, arrivals, the slowest position apart from the arrivals' spread, the whole model's figures
# (model_*) scaled from two depths with the per-iteration fixed cost once (older hybrid rows: blank)
INTERFERENCE_SCHEMA = 4
CSV_NAME = "interference.csv"
RUN_JSON = "run.json"
# alone: the decode step by itself; colocated: beside a looped prefill of the same model on the same device;
# protected: co-located with the decode given priority (a high-priority stream) or reserved capacity (its own cores);
# hybrid: one forward iteration carries the decode users' tokens and an arriving prompt's (whole, or a chunk of it)
MODES = ("alone", "colocated", "protected", "hybrid")
WHOLE = "whole"  # the chunk of a hybrid row that carries the whole prompt in one iteration
# A co-located row whose prefill ran through less of a timed window than this understates the stretch: its reason
# says so, and the phase model does not use it.
COVERED_MIN = 0.95
# One row per (model, layers, dtype, batch, context, prompt, mode, mechanism, chunk) on one device.
KEY_COLUMNS = ("device", "model", "layers", "dtype", "batch", "context", "prompt", "mode", "mechanism", "chunk")

INTERFERENCE_COLUMNS = (
    "run_id", "time", "device",
    "device_name",  # the device as result rows name it (the CPU or GPU model), for the phase model's lookup
    "device_kind", "model", "layers", "dtype",
    "batch",  # decode sequences, one new token each per step
    "context",  # tokens already in each decode sequence's KV cache
    "prompt",  # tokens of the prefill co-located with the decode (the same prompt length for the alone row)
    "mode", "mechanism",  # e.g. colocated / process, protected / disjoint cores or priority stream, hybrid / chunked
    "chunk",  # hybrid rows: the prompt's tokens per iteration ("64", ...) or "whole"; blank for spatial rows
    "chunk_tokens",  # hybrid rows: the chunk in tokens (the prompt's for whole)
    "iterations",  # hybrid rows: iterations from the prompt's arrival to its first token
    # the decode users' inter-token latency: hybrid rows over the prompt's iterations, spatial rows over the decode
    # samples (alone rows: by itself), pooled over the rounds; judged on its tail, never on a median alone. Hybrid
    # rows: all latency columns without model_ are of the `layers` timed. p90 needs 10 samples, p99 100 (else blank)
    "itl_mean_ms", "itl_p50_ms", "itl_p90_ms", "itl_p99_ms", "itl_max_ms",
    "itl_tail_ms", "itl_tail",  # the p99 where 100 samples support it, else the max ("max of N")
    "arrivals",  # hybrid rows: the prompt's arrivals measured (TTFT is their median)
    "ttft_low_ms", "ttft_high_ms",  # hybrid rows: the 95% interval of TTFT's median over the arrivals (6 or more)
    "itl_position_max_ms", "itl_position_max_low_ms", "itl_position_max_high_ms",  # the slowest iteration position's
    # median over the arrivals, with its interval: the position in the prompt, apart from the arrivals' spread
    "position_range_pct",  # the slowest position's median against the fastest's, in percent
    "arrival_range_pct",  # the slowest arrival's TTFT against the fastest's, in percent
    "decode_only_ms", "decode_only_p99_ms",  # the decode-only iteration (hybrid rows) or the alone row's decode
    "ttft_ms",  # hybrid rows: the prompt's arrival to its first token (the sum of its iterations), median of arrivals
    "ttft_max_ms",  # the slowest arrival's
    "decode_tokens_per_s",  # hybrid rows: the decode users' tokens/s (all of them) while the prompt is processed
    "chunk_cost",  # hybrid rows: ttft_ms / ttft_ms of the whole prompt in one iteration (same batch and prompt)
    "decode_ms", "decode_p10_ms", "decode_p90_ms", "samples",  # the decode step, pooled over the rounds
    "stretch",  # decode_ms / decode_ms of the alone row of the same batch, context and prompt
    "p90_stretch",  # decode_p90_ms / the alone row's decode_p90_ms
    "tokens_per_s_per_user",  # 1000 / model_itl_ms: what each decode user sees, of the whole model (schema <= 2:
    # 1000 / decode_ms of the layers measured)
    "model_layers",  # the model's layers: `layers` of them were timed
    "head_ms",  # the final norm, lm_head and greedy pick over the batch's tokens, timed alone (counted once)
    "model_itl_ms",  # the whole model's mean ITL: head_ms + (itl_mean_ms - head_ms) x model_layers / layers
    "whole_model",  # "all N layers", "scaled from L of N layers" (spatial rows) or "from L/2 and L of N layers, the
    # per-iteration fixed cost once" (hybrid rows): where the whole model's figures come from
    "model_itl_tail_ms", "model_ttft_ms", "model_ttft_low_ms", "model_ttft_high_ms", "model_decode_tokens_per_s",
    "model_chunk_cost",  # hybrid rows, the whole model: each iteration position's samples plus the untimed layers at
    # that position's per-layer cost ((t(L) - t(L/2)) / (L - L/2), median over arrivals); TTFT's interval adds the
    # extrapolation's own noise in quadrature
    "fixed_ms",  # hybrid rows: the per-iteration fixed cost t(L) - L x per-layer (head, concatenations), mean over
    # positions, counted once
    "zero_layer_ttft_ms",  # hybrid rows: the same arrival through no layer (the head, the positions' gather, the
    # inputs' concatenation, the read-back), the median over arrivals of its iterations' sum
    "zero_layer_slowest_ms",  # hybrid rows: the zero-layer iteration at the slowest position (its median)
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
               "prefill_threads", "rounds", "chunk_tokens", "iterations", "model_layers", "arrivals")
ITL_COLUMNS = ("itl_mean_ms", "itl_p50_ms", "itl_p90_ms", "itl_p99_ms", "itl_max_ms")
FLOAT_COLUMNS = ("decode_ms", "decode_p10_ms", "decode_p90_ms", "stretch", "p90_stretch", "tokens_per_s_per_user",
                 "prefill_alone_ms", "prefill_ms", "prefill_slowdown", "covered", "window_s", "others_cores",
                 *ITL_COLUMNS, "decode_only_ms", "decode_only_p99_ms", "ttft_ms", "ttft_max_ms",
                 "decode_tokens_per_s", "chunk_cost", "head_ms", "model_itl_ms", "itl_tail_ms", "ttft_low_ms",
                 "ttft_high_ms", "itl_position_max_ms", "itl_position_max_low_ms", "itl_position_max_high_ms",
                 "position_range_pct", "arrival_range_pct", "model_itl_tail_ms", "model_ttft_ms", "model_ttft_low_ms",
                 "model_ttft_high_ms", "model_decode_tokens_per_s", "model_chunk_cost", "fixed_ms",
                 "zero_layer_ttft_ms", "zero_layer_slowest_ms")
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
    # schema <= 2 rows knew the median and p90 only: they are the ITL's p50 and p90 (mean and p99 stay blank)
    out["itl_p50_ms"] = out["itl_p50_ms"].fillna(out["decode_ms"])
    out["itl_p90_ms"] = out["itl_p90_ms"].fillna(out["decode_p90_ms"])
    # schema <= 3 read percentiles from any count: blank where the samples do not support them, the tail the max
    samples = out["samples"].astype(float)
    out.loc[samples < 10, "itl_p90_ms"] = np.nan
    out.loc[samples < 100, "itl_p99_ms"] = np.nan
    old = out["itl_tail"].eq("") & out["itl_tail_ms"].isna()
    few = old & out["itl_p99_ms"].isna() & out["itl_max_ms"].notna()
    out.loc[few, "itl_tail_ms"] = out.loc[few, "itl_max_ms"]
    out.loc[few, "itl_tail"] = [f"max of {int(n)}" if n == n else "max" for n in samples[few]]
    enough = old & out["itl_p99_ms"].notna()
    out.loc[enough, "itl_tail_ms"] = out.loc[enough, "itl_p99_ms"]
    out.loc[enough, "itl_tail"] = "p99"
    out["noisy"] = out["noisy"].fillna(False)
    unknown = sorted(set(out["mode"]) - set(MODES))
    if unknown:
        raise ValueError(f"column 'mode' holds {unknown[0]!r}, not one of {', '.join(MODES)}")
    return out[list(INTERFERENCE_COLUMNS) + [c for c in out.columns if c not in INTERFERENCE_COLUMNS]]
