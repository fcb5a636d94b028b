"""A row's roof from its cost and the measured ceilings (torch-free: the runner, pytest bench, the loader and the
figures share it): the memory floor of its reads and writes, the compute time, and which one bounds it."""

from __future__ import annotations

import numpy as np

# How a row's roof was found (its `roof_model` column).
READ_WRITE = "read+write"  # the floor of its read and write bytes at the read, write (and copy) ceilings
COPY = "copy"  # all its bytes at the copy bandwidth: a file of schema 4 or older, or an operator without the split


def _seconds(nbytes, gbps):
    """nbytes / gbps in seconds, 0 where nothing moves (so a missing write ceiling costs a read-only row nothing)."""
    nbytes, gbps = np.asarray(nbytes, dtype=float), np.asarray(gbps, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(nbytes == 0, 0.0, nbytes / (gbps * 1e9))


def memory_floor_s(read_bytes, write_bytes, read_gbps, write_gbps, copy_gbps=np.nan):
    """Seconds to read `read_bytes` and write `write_bytes` past the caches: read/read_gbps + write/write_gbps.

    Where the copy moved a read-and-write pair faster than a read plus a write (a fill's stores slower than the
    copy's, as with write-allocate caches beside streaming stores), the pairs count at the copy's rate:
    min(r/R + w/W, 2·min(r, w)/C + (r - min)/R + (w - min)/W). The floor is then the least time the three measured
    streams allow, so a copy at the copy ceiling sits at 100% of its roof, never above."""
    r, w = np.asarray(read_bytes, dtype=float), np.asarray(write_bytes, dtype=float)
    apart = _seconds(r, read_gbps) + _seconds(w, write_gbps)
    pairs = np.minimum(r, w)
    paired = _seconds(2 * pairs, copy_gbps) + _seconds(r - pairs, read_gbps) + _seconds(w - pairs, write_gbps)
    return np.fmin(apart, paired)  # fmin: a missing copy ceiling (NaN) leaves the floor read + write apart


def copy_floor_s(nbytes, copy_gbps):
    """Seconds to move `nbytes` (read plus written) at the copy bandwidth: the roof of schema 4 and earlier."""
    return _seconds(nbytes, copy_gbps)


def roof(flops, floor_s, peak_tflops) -> tuple:
    """(roof_tflops, roof_s, bound) from the FLOPs, the memory floor and the compute ceiling, elementwise:
    roof_tflops = min(peak, flops / floor) (0 for an op without arithmetic), roof_s = max(flops / peak, floor) the
    least time the row can take, bound "memory" where the floor is the larger term, else "compute" ("" where
    either is unknown)."""
    flops, floor_s = np.asarray(flops, dtype=float), np.asarray(floor_s, dtype=float)
    peak = np.asarray(peak_tflops, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        compute_s = np.where(flops == 0, 0.0, flops / (peak * 1e12))
        roof_tflops = np.where(flops == 0, 0.0, np.fmin(peak, flops / floor_s / 1e12))
    known = ~np.isnan(floor_s) & ~np.isnan(compute_s)
    bound = np.where(known, np.where(floor_s > compute_s, "memory", "compute"), "")
    return roof_tflops, np.fmax(compute_s, floor_s), bound


def compute_peak(peaks, compute: str) -> float:
    """The compute ceiling of arithmetic in `compute` from the matmul TFLOP/s measured per dtype (`peaks`): one dtype's
    own, or, for dtypes joined by '+' that take equal shares of the FLOPs, n / sum(1 / peak), the rate at which the
    shares run one after the other. KeyError for a dtype not measured."""
    parts = compute.split("+")
    return len(parts) / sum(1.0 / float(peaks[p]) for p in parts)


def pct_of_roof(roof_s, latency_ms):
    """100 · the least time the roof allows / the measured time: % of the roof for any op, arithmetic or not."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return 100.0 * np.asarray(roof_s, dtype=float) / (np.asarray(latency_ms, dtype=float) / 1e3)


def row_roof(flops, read_bytes, write_bytes, nbytes, peak_tflops, read_gbps, write_gbps, copy_gbps) -> tuple:
    """(roof_tflops, roof_s, bound, roof_model) of rows, elementwise: the read+write floor where the read and
    write bytes and ceilings are known, else all the bytes at the copy bandwidth (roof_model says which)."""
    split = np.isfinite(np.asarray(read_bytes, dtype=float)) & np.isfinite(np.asarray(write_bytes, dtype=float)) \
        & np.isfinite(np.asarray(read_gbps, dtype=float)) & np.isfinite(np.asarray(write_gbps, dtype=float))
    floor = np.where(split, memory_floor_s(read_bytes, write_bytes, read_gbps, write_gbps, copy_gbps),
                     copy_floor_s(nbytes, copy_gbps))
    roof_tflops, roof_s, bound = roof(flops, floor, peak_tflops)
    return roof_tflops, roof_s, bound, np.where(split, READ_WRITE, COPY)


def roof_of_row(row) -> tuple:
    """row_roof of a row (a dict) or of rows (a DataFrame) from their columns: flops, read_bytes, write_bytes, bytes,
    peak_tflops, read_gbps, write_gbps and peak_gbps (the copy); a column or key that is missing counts as unknown."""
    def column(name):
        value = row.get(name, np.nan) if hasattr(row, "get") else np.nan
        return np.asarray(np.nan if value is None else value, dtype=float)

    return row_roof(column("flops"), column("read_bytes"), column("write_bytes"), column("bytes"),
                    column("peak_tflops"), column("read_gbps"), column("write_gbps"), column("peak_gbps"))
