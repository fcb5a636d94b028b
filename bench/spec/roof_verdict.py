"""A row's verdict against its roof: % of roof from its latency, the above-roof finding and where its interval
stands, and a stored row judged anew against the ceilings measured after its run."""

from __future__ import annotations

import math

from . import roof as states
from .roof import COPY, L2, LLC, MEMORY, WARM, compute_peak, level_notes, memory_figures, pct_of_roof, roof_of_row
from .schema import ABOVE_ROOF_PCT, cell_float


def speed_figures(row: dict, latency_ms: float) -> dict:
    """Latency, TFLOP/s, GB/s and % of roofline of a row from its median latency: % of roof is the least time its
    roof allows over the time measured (for an op with no arithmetic, a copy, its share of its memory floor)."""
    seconds = latency_ms / 1e3
    roof_s = float(roof_of_row(row)[1])
    return {"latency_ms": latency_ms, "tflops": row["flops"] / seconds / 1e12, "gbps": row["bytes"] / seconds / 1e9,
            "pct_roofline": float(pct_of_roof(roof_s, latency_ms))}


_HOW = {states.ROTATED: "timed cold: its streamed operands rotated over copies past 2x the LLC, its activations warm",
        states.EVICTED: "timed cold: 2x the LLC read before each call",
        states.FLUSHED_L2: "timed cold: the L2 flushed before each call"}


def roof_finding(row: dict) -> str:
    """Why a compiled row may stand above the roof its state implies: where its figures most likely come from."""
    pct = f"{row['pct_roofline']:.0f}% of its measured roof{_slow_end(row)}"
    state, level, mib = row.get("cache_state") or "", row.get("roof_level") or MEMORY, row["bytes"] / 2**20
    if level in (L2, LLC):
        size = cell_float(row.get(f"{level}_bytes")) / 2**20
        at = (f"judged at a farther level's where its own read below them ({row['level_note']})"
              if row.get("level_note") else "judged at the ceilings measured resident there")
        return (f"above roof: {pct}; timed warm, its {mib:.2f} MiB fit the {size:g} MiB {level.upper()} and are {at}: "
                "a cache ceiling measured low or a cost model that counts too few bytes: a bug to find before it is a "
                "result")
    if state == WARM:
        return (f"above roof: {pct}; timed warm, its {mib:.2f} MiB judged at memory's ceilings (no ceiling of a "
                "cache level it fits), so it may read from cache, not memory")
    basis = ("its bytes at the copy bandwidth (its cost model gives no read/write split)"
             if row.get("roof_model") == COPY else "its read and write bytes at the read and write ceilings")
    return (f"above roof: {pct} ({basis}); {_HOW.get(state, 'cache state unknown')}: a ceiling measured low (a busy "
            "machine?) or a cost model that counts too few bytes or FLOPs: a bug to find before it is a result")


def _slow_end(row: dict) -> str:
    """Where the slow end of the row's 95% interval stands: above the roof too, or not (the median alone is)."""
    latency, slow = cell_float(row.get("latency_ms")), cell_float(row.get("latency_ci_high_ms"))
    if not (math.isfinite(latency) and math.isfinite(slow) and slow > 0):
        return " (no interval)"
    at_slow = float(row["pct_roofline"]) * latency / slow
    verdict = "above beyond the noise" if at_slow > ABOVE_ROOF_PCT else "unresolved: the interval straddles the roof"
    return f", {at_slow:.0f}% at the slow end of its 95% interval ({verdict})"


def judged(row: dict) -> dict:
    """above_roof from a row's % of the roof its state implies (compiled rows only: an interpreter's times are not
    speed), its finding in `reason`; a finding that no longer holds is cleared."""
    above = row["mode"] == "compiled" and float(row["pct_roofline"]) > ABOVE_ROOF_PCT
    reason = roof_finding(row) if above else ("" if str(row.get("above_roof")) == "True" else row["reason"])
    return {**row, "above_roof": above, "reason": reason}


MEMORY_COLUMNS = ("peak_gbps", "read_gbps", "write_gbps")  # a row judged against the ceilings before has these
LEVEL_COLUMNS = {"level_read_gbps": "read_gbps", "level_write_gbps": "write_gbps", "level_copy_gbps": "copy_gbps"}


def rejudged(row: dict, substitutions: dict, ceil) -> dict:
    """A stored row (CSV text) judged anew where its memory ceilings are among `substitutions` (bench.instruments.
    ceiling_drift: "values", {value before: (value used, drift)} of the streams, found by value; "levels", {level:
    {figure: (value used, drift)}} of a warm row's level ceilings; "matmuls", {dtype: drift}): its ceilings replaced,
    its compute ceiling recomputed for its compute dtype from `ceil` (the Ceilings used), its roof, % of roof and
    finding recomputed, a warm row's level_note too (whether `ceil`'s level figures read below a farther level's),
    and in `ceiling_drift_pct` the largest drift of the ceilings that set its roof (the matmul of a compute-bound row,
    the streams of a memory-bound one); a row judged against other ceilings (an earlier invocation's) is returned as
    it was."""
    values, subs = {c: cell_float(row.get(c)) for c in (*MEMORY_COLUMNS, "peak_tflops")}, substitutions["values"]
    if not any(values[c] in subs for c in MEMORY_COLUMNS):
        return row
    hits = {c: subs[v] for c, v in values.items() if v in subs and c != "peak_tflops"}
    level = substitutions["levels"].get(row.get("roof_level"), {})
    hits.update({c: level[figure] for c, figure in LEVEL_COLUMNS.items() if figure in level})
    note = {"level_note": level_notes(ceil.levels, memory_figures(ceil)).get(row["roof_level"], "")} if level else {}
    numbers = {c: cell_float(row.get(c)) for c in ("flops", "read_bytes", "write_bytes", "bytes", "latency_ms",
                                                   *LEVEL_COLUMNS)}
    out = {**row, **values, **numbers, **{c: used for c, (used, _) in hits.items()}, **note}
    compute, matmuls = str(row.get("compute_dtype") or ""), substitutions.get("matmuls", {})
    if compute and all(part in ceil.peak_tflops for part in compute.split("+")):
        out["peak_tflops"] = compute_peak(ceil.peak_tflops, compute)
        compute_drifts = [matmuls.get(part, math.nan) for part in compute.split("+")]
    elif values["peak_tflops"] in subs:  # a row from before compute_dtype: its one matmul, found by value
        out["peak_tflops"], moved = subs[values["peak_tflops"]]
        compute_drifts = [moved]
    else:
        compute_drifts = []
    roof_tflops, _, bound, model = roof_of_row(out)
    setting = compute_drifts if str(bound) == "compute" else [d for _, d in hits.values()]
    drifts = [abs(d) for d in setting if math.isfinite(d)]
    out.update(roof_tflops=float(roof_tflops), bound=str(bound), roof_model=str(model),
               ceiling_drift_pct=100 * max(drifts) if drifts else math.nan)
    if row.get("status") != "ok":
        return out
    out["pct_roofline"] = speed_figures(out, out["latency_ms"])["pct_roofline"]
    return with_ceiling_load(judged(out), ceil)


def with_ceiling_load(row: dict, ceil) -> dict:
    """An above-roof row's finding, with the load its ceilings were measured under where they carry a load warning
    (a roof measured while others held the CPU reads low, and the rows timed in quieter moments stand above it)."""
    load = [w for w in ceil.warnings if "under load" in w]
    if not row.get("above_roof") or not load:
        return row
    return {**row, "reason": f"{row['reason']}; {load[0]}: they read low (PHASEBENCH_HOST_CEILINGS keeps quiet ones)"}
