"""Per-case summary of a profile: kernel time, wall time and launch overhead of each timed range."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .names import ALL_FIELDS, L2FLUSH, TIMING, parse_case_key, stage_of

SUMMARY_COLUMNS = ["key", *ALL_FIELDS, "ranges", "wall_ns", "flush_ns", "kernel_count", "kernel_time_ns",
                   "flush_kernel_ns", "launch_overhead_ns"]


def _owner_of_path(path) -> tuple[str | None, bool]:
    """(timed case key or None, launched inside an l2flush range) from the enclosing ranges (innermost last)."""
    in_flush = False
    for name in reversed(tuple(path)):
        if name == L2FLUSH:
            in_flush = True
            continue
        stage = stage_of(name)
        if stage is not None:
            return (name if stage[0] == TIMING else None), in_flush
    return None, in_flush  # ranges that name no case (e.g. an op inside the kernel call) are looked through


def owners(kernels: pd.DataFrame) -> pd.DataFrame:
    """Per kernel: `key`, the timed case it ran in (None outside any), and `flush`, True when it was
    launched inside an 'l2flush' range nested in that case's range (the flush between its samples).

    Without an nvtx_path column only the innermost range is known: a kernel whose range is 'l2flush'
    cannot be placed in a case then, and gets key None.
    """
    if "nvtx_path" in kernels:
        found = [_owner_of_path(p) if isinstance(p, (tuple, list)) else (None, False) for p in kernels["nvtx_path"]]
    else:
        found = [(n if isinstance(n, str) and parse_case_key(n) else None, False) for n in kernels["nvtx_range"]]
    keys = pd.Series([k for k, _ in found], index=kernels.index, dtype=object)
    flush = pd.Series([f and k is not None for k, f in found], index=kernels.index, dtype=bool)
    return pd.DataFrame({"key": keys, "flush": flush})


def attribute(kernels: pd.DataFrame) -> pd.Series:
    """The timed case key of each of the case's own kernels (None outside timed ranges and for its L2 flushes)."""
    own = owners(kernels)
    return own["key"].where(~own["flush"], None)


def _flush_inside(timed: pd.DataFrame, flushes: pd.DataFrame) -> np.ndarray:
    """Total host duration of the l2flush ranges nested in each timed range (same thread)."""
    totals = np.zeros(len(timed), dtype=np.int64)
    if flushes.empty:
        return totals
    f_start, f_end = flushes["start_ns"].to_numpy(np.int64), flushes["end_ns"].to_numpy(np.int64)
    f_dur = flushes["duration_ns"].to_numpy(np.int64)
    same_thread = "tid" in flushes and "tid" in timed
    f_tid = flushes["tid"].to_numpy(object) if same_thread else None
    for i, row in enumerate(timed.itertuples(index=False)):
        inside = (f_start >= row.start_ns) & (f_end <= row.end_ns)
        if same_thread:
            inside &= f_tid == row.tid
        totals[i] = f_dur[inside].sum()
    return totals


def summarize(kernels: pd.DataFrame, ranges: pd.DataFrame) -> pd.DataFrame:
    """One row per timed case key found in `ranges` (columns: SUMMARY_COLUMNS), in order of first start.

    kernels: from nsys.read_kernels / torch_trace.read_kernels; ranges: from nsys.read_nvtx /
    torch_trace.read_ranges. wall_ns sums the range's occurrences; kernel_time_ns sums the GPU durations
    of the case's own kernels launched in it, flush_kernel_ns those of the kernels launched in the
    l2flush ranges nested in it; flush_ns is the host span of those l2flush ranges (for information:
    it is enqueue time, not the flushes' GPU time). launch_overhead_ns = wall - kernel time - flush kernel time.
    """
    timed = ranges[np.array([parse_case_key(n) is not None for n in ranges["name"]], dtype=bool)]
    if "start_ns" in timed:
        timed = timed.sort_values("start_ns", kind="stable")
    timed = timed.assign(flush_ns=_flush_inside(timed, ranges[ranges["name"] == L2FLUSH]))
    walls = timed.groupby("name", sort=False).agg(ranges=("duration_ns", "size"), wall_ns=("duration_ns", "sum"),
                                                  flush_ns=("flush_ns", "sum"))
    own = owners(kernels)
    placed = kernels[["duration_ns"]].assign(key=own["key"], flush=own["flush"]).dropna(subset=["key"])
    work = placed[~placed["flush"]].groupby("key", sort=False).agg(kernel_count=("duration_ns", "size"),
                                                                  kernel_time_ns=("duration_ns", "sum"))
    flushing = placed[placed["flush"]].groupby("key", sort=False).agg(flush_kernel_ns=("duration_ns", "sum"))
    out = walls.join(work, how="left").join(flushing, how="left")
    out = out.fillna({"kernel_count": 0, "kernel_time_ns": 0, "flush_kernel_ns": 0})
    out = out.rename_axis("key").reset_index()
    fields = pd.DataFrame([parse_case_key(k) for k in out["key"]], columns=list(ALL_FIELDS))
    out = pd.concat([out[["key"]], fields, out.drop(columns="key")], axis=1)
    # attention fields are empty on linear rows and the other way round: nullable ints
    ints = [f for f in ALL_FIELDS if f not in ("op", "impl", "phase", "dtype", "causal", "kind", "scheme", "sinks",
                                               "kv_dtype")]
    out = out.astype({"ranges": "int64", "wall_ns": "int64", "flush_ns": "int64", "kernel_count": "int64",
                      "kernel_time_ns": "int64", "flush_kernel_ns": "int64", **{f: "Int64" for f in ints},
                      "causal": "boolean", "sinks": "boolean"})
    # what is neither the case's kernels nor the flush kernels between its samples: launches, syncs, Python
    out["launch_overhead_ns"] = out["wall_ns"] - out["kernel_time_ns"] - out["flush_kernel_ns"]
    return out[SUMMARY_COLUMNS]


def summarize_file(path, kind: str = "auto") -> pd.DataFrame:
    """summarize() of an nsys SQLite export or a torch.profiler trace (.json / .json.gz)."""
    try:
        with open(path, "rb") as f:
            is_sqlite = f.read(16) == b"SQLite format 3\x00"
    except OSError:
        is_sqlite = False  # let the trace reader name the problem
    if is_sqlite:
        from . import nsys
        return summarize(nsys.read_kernels(path), nsys.read_nvtx(path))
    from . import torch_trace
    return summarize(torch_trace.read_kernels(path, kind=kind), torch_trace.read_ranges(path))
