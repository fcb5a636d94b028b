"""A row's roof from its cost, its cache state and the measured ceilings (torch-free: the runner, pytest bench, the
loader and the figures share it): the memory floor of its reads and writes at the ceilings of the level its operands
are read from, the compute time, and which one bounds it."""

from __future__ import annotations

import numpy as np

# How a row's roof was found (its `roof_model` column).
READ_WRITE = "read+write"  # the floor of its read and write bytes at the read, write (and copy) ceilings
COPY = "copy"  # all its bytes at the copy bandwidth: a file of schema 4 or older, or an operator without the split

# How a row's operands were prepared (its `cache_state` column): on the host the streamed operands rotated over copies
# past the LLC, or the caches evicted (a buffer read) before each call, or left warm; on a GPU the L2 flushed.
ROTATED, EVICTED, WARM, FLUSHED_L2 = "rotated", "evicted", "warm", "flushed-l2"
COLD_STATES = (ROTATED, EVICTED, FLUSHED_L2)
# Where a row's bytes are read from (its `roof_level`): memory past the caches, or, for a warm row whose footprint
# fits it, the L2 or the last-level cache, each judged at the read, write and copy ceilings measured there.
MEMORY, LLC, L2 = "memory", "llc", "l2"


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


def roof_level(cache_state, nbytes, l2_bytes, llc_bytes):
    """The level a row's bytes are read from, elementwise: a warm row's footprint (the bytes it reads and writes) that
    fits the L2 or the last-level cache (their capacities summed over the instances the process may use; 0 or blank:
    unknown) is read from there; every other row (cold, or too large) from memory."""
    state = np.asarray(cache_state, dtype=object)
    nbytes, l2, llc = (np.asarray(v, dtype=float) for v in (nbytes, l2_bytes, llc_bytes))
    warm = state == WARM
    with np.errstate(invalid="ignore"):
        in_l2, in_llc = warm & (nbytes <= l2), warm & (nbytes <= llc)
    return np.where(in_l2, L2, np.where(in_llc, LLC, MEMORY))


STREAM_FIGURES = ("read_gbps", "write_gbps", "copy_gbps")  # a level's ceilings, and memory's, by name


def memory_figures(ceil) -> dict:
    """The ceilings past the caches of `ceil` (anything with read_gbps, write_gbps and copy_gbps: a Ceilings)."""
    return {k: float(getattr(ceil, k)) for k in STREAM_FIGURES}


def _nearer(own: float, farther: float) -> bool:
    """Whether a level's own figure judges its rows: measured, and not below the farther figure (or that unknown)."""
    return not np.isnan(own) and (np.isnan(farther) or own >= farther)


def _judging(levels: dict, memory: dict) -> dict:
    """{level: {figure: (the value a warm row there is judged at, where it was measured)}}: the highest measured at
    that level or any farther one, memory's included, the nearer kept on a tie."""
    found, farther = {}, {k: (float(memory.get(k, np.nan)), MEMORY) for k in STREAM_FIGURES}
    for level in (LLC, L2):
        if level in levels:
            farther = {k: (own, level) if _nearer(own, value) else (value, where)
                       for k, (value, where) in farther.items() for own in (float(levels[level][k]),)}
            found[level] = farther
    return found


def level_ceilings(levels: dict, memory: dict) -> dict:
    """{level: {"read_gbps", "write_gbps", "copy_gbps"}} that a warm row read from each cache level in `levels` (its
    measured figures by level) is judged at: the highest measured at that level or any farther one, `memory`'s
    included. A nearer cache is never slower than a farther one, so a nearer level's figure that reads below a
    farther one's is a measurement that came out low (a busy core, a buffer that spilled), and the farther figure is
    the tighter bound on the row; it is never a silent swap: level_notes says which figure replaced which, on each
    row judged there (its `level_note`) and in the ceilings' warnings (level_warnings)."""
    judging = _judging(levels, memory)
    return {level: {k: value for k, (value, _) in figures.items()} for level, figures in judging.items()}


def _whose(level: str) -> str:
    return "memory's" if level == MEMORY else f"the {level}'s"


def _own(level: str, figure: str, levels: dict) -> str:
    own = float(levels[level][figure])
    return f"{_whose(level)} own {own:.1f}" if np.isfinite(own) else f"none measured in the {level}"


def level_notes(levels: dict, memory: dict) -> dict:
    """{level: note} for each cache level in `levels`: "" where every figure a warm row there is judged at is the
    level's own, else which farther figure replaced which ("read at the llc's 172.0 GB/s (the l2's own 84.2)")."""
    found = {}
    for level, figures in _judging(levels, memory).items():
        found[level] = "; ".join(f"{k.removesuffix('_gbps')} at {_whose(where)} {value:.1f} GB/s "
                                 f"({_own(level, k, levels)})"
                                 for k, (value, where) in figures.items() if where != level and np.isfinite(value))
    return found


def level_warnings(levels: dict, memory: dict) -> list[str]:
    """One line per cache level whose own figures read below a farther level's: what its warm rows are judged at."""
    return [f"{level} ceilings below a farther level's: {note}; the warm rows read from the {level} are judged at "
            "the farther figure, and their level_note says so" for level, note in level_notes(levels, memory).items()
            if note]


def roof_of_row(row) -> tuple:
    """row_roof of a row (a dict) or of rows (a DataFrame) from their columns: flops, read_bytes, write_bytes, bytes,
    peak_tflops, and the ceilings of the level the row is read from: level_read_gbps, level_write_gbps and
    level_copy_gbps where its roof_level is a cache (and they are there), else read_gbps, write_gbps and peak_gbps
    (memory's copy); a column or key that is missing counts as unknown."""
    def column(name):
        value = row.get(name, np.nan) if hasattr(row, "get") else np.nan
        return np.asarray(np.nan if value is None else value, dtype=float)

    cached = np.isin(np.asarray(row.get("roof_level", MEMORY) if hasattr(row, "get") else MEMORY, dtype=object),
                     (L2, LLC)) & np.isfinite(column("level_read_gbps"))  # a level without its figures: memory's
    read, write, copy = (np.where(cached, column(f"level_{s}_gbps"), column(memory))
                         for s, memory in (("read", "read_gbps"), ("write", "write_gbps"), ("copy", "peak_gbps")))
    return row_roof(column("flops"), column("read_bytes"), column("write_bytes"), column("bytes"),
                    column("peak_tflops"), read, write, copy)
