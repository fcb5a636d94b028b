"""Result row and profile table columns, their dtypes and defaults, shared by the runner and the loaders (no torch)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from .roof import COPY, MEMORY

# 2: op, shape, seqlens, kv_tokens, linear m/n/k/projection, noisy, noise_reason, profiled; timer joined.
# 3: above_roof (a compiled row above ABOVE_ROOF_PCT of its measured roof, its finding in `reason`).
# 4: page_size (an attention case whose KV cache is read in pages through a block table; 0: contiguous).
# 5: read_bytes, write_bytes, read_gbps, write_gbps, roof_model: the roof is the row's own floor of its reads and
#    writes (bench.spec.roof); rows of older files keep their copy-bandwidth roof, roof_model "copy" says so.
# 6: scheme (a quantized linear case's weight scheme: int8, int4-g128, ...; blank for every other row, and in older
#    files, whose rows all had unquantized weights).
# 7: latency_ci_low_ms, latency_ci_high_ms, latency_ci_rel, converged, outliers (the 95% interval of the median from
#    its order statistics, its relative half-width, whether sampling stopped on its target, and the samples beyond
#    Tukey's 1.5 IQR fences, counted and kept: bench.spec.interval); blank in older files.
#    cache_state, cold_how, l2_bytes, llc_bytes, roof_level, level_read_gbps, level_write_gbps, level_copy_gbps,
#    ceiling_drift_pct: how the operands were prepared (rotated, evicted, warm; flushed-l2 on a GPU; in words, with
#    the copies and the bytes read between two reads of one copy, or before each call), the footprint's
#    caches, the level the roof reads from and its ceilings (a warm row that fits a cache), and how far the ceilings
#    moved between their measurements before and after the run (rows are judged against the higher).
#    window_left (an attention case's sliding window, FlashInfer's; -1: none, and in older files and other operators),
#    sinks (a sink logit per query head in the softmax denominator; False in older files), head_dim_v (the value's
#    head dim where it differs from head_dim: MLA's 512 of a 576-wide latent; blank otherwise).
#    compute_dtype (the precision the row's kernel multiplies in, whose measured matmul ceiling is its peak_tflops:
#    fp32 for torch's host weight-only kernels on bf16 activations; older rows, held to their dtype's, read it).
#    experts, top_k, touched_experts, routing, routing_seed (a routed-experts case: m tokens through each one's top_k
#    of `experts` experts, n and k the expert's intermediate and hidden sizes; touched_experts the distinct experts its
#    routing reads; blank for every other row and in older files).
# 8: rounds, round_latencies_ms, latency_between_low_ms, latency_between_high_ms, latency_between_rel (a row measured
#    in rounds, each in a worker process of its own: how many, each round's median, and the 95% interval a repeat of
#    the run lands in: bench.spec.between_runs); roof_moment (the measurement of the ceilings the row is judged at:
#    before the run, a round's probe, after it), pct_roof_low, pct_roof_high and roof_verdict (its % of roof over its
#    intervals and every measurement of the ceilings around its rounds: above, within or unresolved); the
#    ceiling_drift_pct of older files is the move between before and after, and their rows the higher of the two.
#    level_note (where a warm row's level measured below a farther level, the farther figure that judged it and the
#    level's own; blank where its level's own figures judged it, for rows read from memory, and in older files, whose
#    rows were judged at the higher figure unsaid).
#    stop_reason, drifting, first_half_ms, second_half_ms, warmup_s (why sampling stopped, whether at a limit with the
#    halves of its samples disagreeing, the halves' medians, the warm-up's seconds); blank in older files (drifting
#    False: none was flagged).
# 9: compile_s, compile_graphs, compile_cache, build_s, recompiles (a compiled impl's first call: its seconds, the
#    graphs it compiled and whether Inductor's cache served them; the seconds its plan built operands beforehand, a
#    flex block mask; the graphs compiled while it was sampled, a recompile that flags it noisy); blank for impls that
#    compile nothing and in older files.
#    kv_dtype (an attention or MLA case whose KV cache, or latent, is stored as fp8 e4m3 with float32 scales: "fp8";
#    blank for a cache in the row's dtype, for every other operator and in older files).
SCHEMA_VERSION = 9
ABOVE_ROOF_PCT = 100.0  # a row past this share of the roof its state implies is a finding (a bug detector)

# The fields of an attention case, in the order rows carry them (bench.ops.attention.cases.AttentionCase).
CASE_COLUMNS = ("batch", "q_heads", "kv_heads", "q_len", "kv_len", "head_dim", "causal", "dtype")
# The fields of a linear case (bench.ops.linear.cases.LinearCase) beside dtype, phase and model.
LINEAR_COLUMNS = ("m", "n", "k", "projection")
# A quantized linear case (bench.ops.qlinear.cases.QLinearCase) has the linear fields and its weight's scheme.
QLINEAR_COLUMNS = (*LINEAR_COLUMNS, "scheme")
# The fields of an elementwise case (bench.ops.elementwise.cases.ElementwiseCase) beside m, n, head_dim and kv_heads.
ELEMENTWISE_COLUMNS = ("kind", "cache_len")
# A routed-experts case (bench.ops.moe.cases.MoeCase) has the linear fields and these; touched_experts is derived.
MOE_COLUMNS = ("experts", "top_k", "touched_experts", "routing", "routing_seed")

# One row per (case, impl), in the order the runner writes them.
RESULT_COLUMNS = (
    "run_id", "time", "device", "device_kind", "suite", "model", "op",
    "impl", "backend", "mode", "phase",
    "shape",  # the case's label for tables ("b2 h32/8 q1 k512 d128 causal", "gate_up m8 n28672 k4096"); never parsed
    *CASE_COLUMNS,
    "seqlens",  # per-sequence KV lengths of a ragged case ("97,1025,3"), provenance only; "" when dense
    "kv_tokens",  # KV positions used, summed over the batch (batch * kv_len when dense)
    "page_size",  # tokens per page of a paged KV cache (block table); 0 for a contiguous cache and other operators
    "window_left",  # a sliding window: query i sees keys j >= i - window_left (FlashInfer's); -1 for none
    "sinks",  # a learned logit per query head joins the softmax denominator (gpt-oss)
    "head_dim_v",  # the value head dim where it differs from head_dim (op mla: 512 of the 576-wide latent); blank else
    "kv_dtype",  # the KV cache's (MLA: the latent's) storage where it is not the row's dtype: fp8; blank else
    *LINEAR_COLUMNS,  # a linear case: x [m, k] times w [n, k]; projection names the layer (qkv, o, ...)
    "scheme",  # a quantized linear case's weight packing (int8, int4-g128, ...); blank for unquantized weights
    *ELEMENTWISE_COLUMNS,  # an elementwise case: its kind (rmsnorm, rotary, ...) over [m, n]; the KV cache rows
    *MOE_COLUMNS,  # a routed-experts case: E experts, top-k per token, the experts its routing touches, the routing
    "flops", "bytes", "intensity",
    "read_bytes", "write_bytes",  # the bytes the cost model reads and writes (bytes is their sum); blank: no split
    "latency_ms", "latency_p20_ms", "latency_p80_ms",
    "latency_ci_low_ms", "latency_ci_high_ms",  # the 95% interval of the median (order statistics; blank: too few)
    "latency_ci_rel",  # its half-width over the median
    "converged",  # sampling stopped on its target: latency_ci_rel under it, the halves agreeing (stop_reason target)
    "outliers",  # samples beyond Q1 - 1.5 IQR or Q3 + 1.5 IQR: counted, never removed
    "stop_reason",  # target, time limit, sample limit, drifting or fixed count (bench.spec.interval.STOP_REASONS)
    "drifting",  # stopped at a limit while the 95% intervals of its halves' medians (in time order) were disjoint
    "first_half_ms", "second_half_ms",  # the medians of the first and the second half of its samples
    "warmup_s",  # how long its warm-up ran: past the minimum only while its timings were not steady
    "rounds",  # rounds pooled in the row, each in a worker process of its own (blank: older files, one round)
    "round_latencies_ms",  # each round's median ("2.21/2.25/2.19")
    "latency_between_low_ms", "latency_between_high_ms",  # the 95% interval a repeat of the run's median lands in
    "latency_between_rel",  # its half-width over the median (blank: under two rounds)
    "samples", "timer",
    "noisy", "noise_reason",  # timed while the device was contended, and why we think so
    "tflops", "gbps", "peak_tflops",
    "compute_dtype",  # what the kernel multiplies in ('+' joins equal shares): peak_tflops is that matmul ceiling
    "peak_gbps",  # the copy bandwidth (read + write bytes), as before schema 5
    "read_gbps", "write_gbps",  # read-only and write-only bandwidth past the last-level cache
    "roof_tflops", "pct_roofline", "bound",
    "roof_model",  # "read+write": the floor of read_bytes and write_bytes; "copy": bytes at peak_gbps (bench.spec.roof)
    "above_roof",  # compiled and past ABOVE_ROOF_PCT of its roof: drawn hollow and counted, the finding in `reason`
    "roof_moment",  # the measurement of the ceilings it is judged at ("before 09:25:08Z", "round 2 ...", "after ...")
    "pct_roof_low", "pct_roof_high",  # its % of roof over its intervals and the ceilings measured around its rounds
    "roof_verdict",  # above (beyond every end of those), within, unresolved; blank: not compiled or not ok
    "cache_state",  # rotated / evicted / warm (host), flushed-l2 (GPU): how the operands were prepared (spec.roof)
    "cold_how",  # what the timer did for it: the operands rotated and the copies, the bytes read before each call
    "l2_bytes", "llc_bytes",  # the caches its footprint (`bytes`) is held against, summed over their instances
    "roof_level",  # memory, llc or l2: where its bytes are read from (a warm row that fits a cache), its roof's level
    "level_read_gbps", "level_write_gbps", "level_copy_gbps",  # that cache level's ceilings; blank for memory
    "level_note",  # a farther level's figure that judged it where its level's own read below it; blank: its own
    "ceiling_drift_pct",  # how far its roof moved over the measurements around its rounds; blank: not measured
    "compile_s",  # a compiled impl's first call, compiling included (untimed, before the gate); blank: none
    "compile_graphs",  # graphs that call compiled: 0 where an earlier case's graph served it (in this process)
    "compile_cache",  # cold (Inductor compiled), disk (its FX graph cache served them), memory (nothing compiled)
    "build_s",  # what its plan built before the first call, outside every call (a flex block mask)
    "recompiles",  # graphs compiled from its first sample to its checked call, over its rounds: non-zero is noisy
    "max_rel_err", "status", "reason",
    "profiled",  # measured under a profiler (`phasebench profile`): timings carry its overhead
)

# Columns the loader adds after the result columns (run metadata and provenance).
RUN_COLUMNS = (
    "source",  # the file a row was read from
    "python_version", "torch_version", "triton_version", "flash_attn_version",
    "phasebench_version", "git_commit",
    "datasheet_name", "datasheet_tflops", "datasheet_gbps",
)

# The fields that identify a case (together with device and dtype when comparing impls).
CASE_FIELDS = ("op", "phase", "batch", "q_heads", "kv_heads", "q_len", "kv_len", "head_dim", "causal", "seqlens",
               "page_size", "window_left", "sinks", "head_dim_v", "kv_dtype", "m", "n", "k", "projection", "scheme",
               "kind", "cache_len", "experts", "top_k", "routing", "routing_seed")

# A results table without these cannot be analysed at all.
REQUIRED_COLUMNS = (
    "impl", "phase", "batch", "q_heads", "kv_heads", "q_len", "kv_len", "head_dim",
    "dtype", "latency_ms", "status",
)

PHASES = ("prefill", "chunked_prefill", "decode")
STATUSES = ("ok", "skipped", "failed", "incorrect")
MODES = ("compiled", "interpreter")

RESULT_STRING_COLUMNS = (
    "run_id", "time", "device", "device_kind", "suite", "model", "op", "impl", "backend", "mode",
    "phase", "shape", "dtype", "seqlens", "kv_dtype", "projection", "scheme", "kind", "routing", "timer",
    "noise_reason",
    "compute_dtype", "bound", "roof_model", "status", "reason", "cache_state", "cold_how", "roof_level", "level_note",
    "round_latencies_ms", "roof_moment", "roof_verdict",
    "stop_reason", "compile_cache",
)
STRING_COLUMNS = RESULT_STRING_COLUMNS + (
    "source", "python_version", "torch_version", "triton_version", "flash_attn_version",
    "phasebench_version", "git_commit", "datasheet_name",
)
INT_COLUMNS = ("batch", "q_heads", "kv_heads", "q_len", "kv_len", "head_dim", "samples", "kv_tokens", "page_size",
               "window_left", "head_dim_v", "m", "n", "k", "cache_len", "outliers", "experts", "top_k",
               "touched_experts", "routing_seed", "rounds")
BOOL_COLUMNS = ("causal", "noisy", "above_roof", "profiled", "converged", "sinks", "drifting")
FLOAT_COLUMNS = (
    "flops", "bytes", "intensity", "read_bytes", "write_bytes", "latency_ms", "latency_p20_ms", "latency_p80_ms",
    "latency_ci_low_ms", "latency_ci_high_ms", "latency_ci_rel",
    "tflops", "gbps", "peak_tflops", "peak_gbps", "read_gbps", "write_gbps", "roof_tflops", "pct_roofline",
    "max_rel_err", "datasheet_tflops", "datasheet_gbps", "l2_bytes", "llc_bytes", "level_read_gbps",
    "level_write_gbps", "level_copy_gbps", "ceiling_drift_pct", "latency_between_low_ms", "latency_between_high_ms",
    "latency_between_rel", "pct_roof_low", "pct_roof_high",
    "first_half_ms", "second_half_ms", "warmup_s", "compile_s", "compile_graphs", "build_s", "recompiles",
)

# Raw latency samples of an ok row (ms), a list column of results.parquet only: never in the CSV, which
# keeps the summary; conform() and the CSV readers leave it as it is (bench.sweep.results writes it).
SAMPLES_COLUMN = "samples_ms"


# Every field that changes a measurement: two rows that agree on all of them measured the same thing.
# phase too: a linear or elementwise case records the phase it stands for, so the same shape may be two cases
KEY_COLUMNS = ("op", "impl", "model", "phase", *CASE_COLUMNS, "seqlens", "page_size", "window_left", "sinks",
               "head_dim_v", "kv_dtype", *QLINEAR_COLUMNS, "kind", "cache_len", "experts", "top_k", "routing",
               "routing_seed", "device", "mode", "timer")
# Values that key as blank: what rows written before their column, and rows of other operators, hold
_BLANK_KEYS = {"page_size": "0", "window_left": "-1", "sinks": "False"}


def sample_key(row) -> tuple:
    """row_key with blanks (None, NaN, NA) as "" and whole floats as ints: one key for a measured row,
    a CSV line and a loaded frame's row, which is how samples.jsonl joins its rows. A contiguous cache's page_size
    (0), no window (-1) and no sinks (False) key as blank too, as in rows written before those columns and rows of
    other operators."""
    return tuple("" if key_text(row.get(c)) == _BLANK_KEYS.get(c) else key_text(row.get(c)) for c in KEY_COLUMNS)


def cell_float(value) -> float:
    """A cell as a float; NaN for blanks and text."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def cell_true(value) -> bool:
    """A cell as a flag: blanks (None, NaN, NA) are False."""
    return key_text(value) != "" and bool(value)


def key_text(value) -> str:
    """A cell as key text: blanks (None, NaN, NA) as "", whole floats as ints."""
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def read_samples(path: Path) -> dict[tuple, list[float]]:
    """{sample_key: samples in ms} from a samples.jsonl; a line torn by a kill is skipped, the latest line wins."""
    found: dict[tuple, list[float]] = {}
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return found
    for line in text.splitlines():
        try:
            entry = json.loads(line)
            found[tuple(entry["key"].get(c, "") for c in KEY_COLUMNS)] = [float(v) for v in entry[SAMPLES_COLUMN]]
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return found

# What a row that lacks a column (an older schema) or leaves it blank holds; other missing
# columns are "" (text) or NA. kv_tokens is derived for dense cases, see conform().
# roof_model: a row without one (schema 4 or older) kept the roof of all its bytes at the copy bandwidth.
# roof_level: a row without one (schema 6 or older) was judged against memory's ceilings.
DEFAULTS = {"op": "attention", "noisy": False, "above_roof": False, "profiled": False, "page_size": 0,
            "window_left": -1, "sinks": False, "roof_model": COPY, "roof_level": MEMORY, "drifting": False}

# Profile summary tables (profiles/summary.py): one row per timed case key, with the case
# fields, ranges (occurrences), wall_ns, kernel_count, kernel_time_ns, launch_overhead_ns.
PROFILE_REQUIRED_COLUMNS = ("key", "kernel_count", "kernel_time_ns", "wall_ns", "launch_overhead_ns")
PROFILE_INT_COLUMNS = ("kernel_count", "ranges", "batch", "q_heads", "kv_heads", "q_len", "kv_len", "head_dim")
# flush_ns: host span of the l2flush ranges (information); flush_kernel_ns: GPU time of the flush kernels
PROFILE_FLOAT_COLUMNS = ("kernel_time_ns", "wall_ns", "launch_overhead_ns", "flush_ns", "flush_kernel_ns")
PROFILE_STRING_COLUMNS = ("key", "impl", "phase", "dtype", "device", "run_id")

_TRUE_WORDS = {"true", "1", "yes", "t", "y", "1.0"}
_FALSE_WORDS = {"false", "0", "no", "f", "n", "0.0"}


def _as_bool(series: pd.Series, name: str) -> pd.Series:
    def convert(value):
        if value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value)):
            return pd.NA
        word = str(value).strip().lower()
        if word in _TRUE_WORDS:
            return True
        if word in _FALSE_WORDS:
            return False
        if word == "":
            return pd.NA
        raise ValueError(f"column {name!r} holds {value!r}, not a boolean")

    return series.map(convert).astype("boolean")


def _as_int(series: pd.Series, name: str) -> pd.Series:
    numbers = _as_float(series, name)
    whole = numbers.dropna()
    if not (whole == np.round(whole)).all():
        raise ValueError(f"column {name!r} holds non-integer values")
    return numbers.astype("Int64")


def _as_float(series: pd.Series, name: str) -> pd.Series:
    try:
        return pd.to_numeric(series, errors="raise").astype(float)
    except (ValueError, TypeError) as error:
        raise ValueError(f"column {name!r} is not numeric ({error})") from None


def _as_str(series: pd.Series) -> pd.Series:
    # Missing text becomes "" (as the runner writes for an empty model or reason),
    # so groupby never silently drops rows.
    return series.astype(object).where(series.notna(), "").map(str).astype(str)


def coerce_columns(
    df: pd.DataFrame,
    *,
    strings=STRING_COLUMNS,
    ints=INT_COLUMNS,
    floats=FLOAT_COLUMNS,
    bools=BOOL_COLUMNS,
) -> pd.DataFrame:
    """Cast the known columns present in `df` to their dtypes; raises ValueError naming a bad column."""
    out = df.copy()
    for name in out.columns:
        if name in strings:
            out[name] = _as_str(out[name])
        elif name in ints:
            out[name] = _as_int(out[name], name)
        elif name in floats:
            out[name] = _as_float(out[name], name)
        elif name in bools:
            out[name] = _as_bool(out[name], name)
    return out


def _flag_above_roof(out: pd.DataFrame) -> None:
    """Rows that leave above_roof blank (files written before schema 3) get it from the rule the runner applies:
    compiled and past ABOVE_ROOF_PCT of the measured roof; the reason says the flag was set on reading."""
    blank = out["above_roof"].isna()
    found = blank & (out["mode"] == "compiled") & (out["pct_roofline"] > ABOVE_ROOF_PCT).fillna(False)
    out.loc[blank, "above_roof"] = found[blank]
    lacking = found & (out["reason"] == "")
    out.loc[lacking, "reason"] = [f"{pct:.0f}% of its measured roof, above {ABOVE_ROOF_PCT:g}%: a finding (flagged "
                                  "on reading a file written before schema 3)"
                                  for pct in out.loc[lacking, "pct_roofline"]]


def conform(df: pd.DataFrame) -> pd.DataFrame:
    """Result rows with every schema and loader column, typed, defaults filled, in schema order (extras last).

    Rows of schema 1 (no op, seqlens, kv_tokens, noisy, noise_reason, profiled) read as dense
    attention rows that were neither noisy nor profiled; rows of schemas 1 and 2 get above_roof by its rule.
    """
    out = df.copy()
    for name in RESULT_COLUMNS + RUN_COLUMNS:
        if name not in out.columns:
            out[name] = "" if name in STRING_COLUMNS else np.nan
    out = coerce_columns(out)
    _flag_above_roof(out)
    for name, value in DEFAULTS.items():
        if name in STRING_COLUMNS:
            out.loc[out[name] == "", name] = value
        else:
            out[name] = out[name].fillna(value)
    held = out["compute_dtype"] == ""  # before schema 7 every row was held to its own dtype's matmul ceiling
    out.loc[held, "compute_dtype"] = out.loc[held, "dtype"]
    dense = out["kv_tokens"].isna() & (out["seqlens"] == "")
    out.loc[dense, "kv_tokens"] = out.loc[dense, "batch"] * out.loc[dense, "kv_len"]
    known = list(RESULT_COLUMNS + RUN_COLUMNS)
    extras = [name for name in out.columns if name not in known]
    return out[known + extras]
