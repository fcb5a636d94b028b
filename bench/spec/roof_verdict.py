"""A row's verdict against its roof: % of roof from its latency at the ceilings of the moment it ran, the above-roof
finding, and where its intervals stand at every ceiling measured while it ran (above, within, unresolved)."""

from __future__ import annotations

import math
import time

from . import roof as states
from .roof import (
    COPY,
    L2,
    LLC,
    MEMORY,
    WARM,
    compute_peak,
    level_ceilings,
    level_notes,
    memory_figures,
    pct_of_roof,
    roof_level,
    roof_of_row,
)
from .schema import ABOVE_ROOF_PCT, FLOAT_COLUMNS, cell_float


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
# A compiled row's verdict against its roof (`roof_verdict`): above its roof at every ceiling measured while it ran
# and at either end of its intervals; within it at all of them; unresolved between (blank: not judged).
ABOVE, WITHIN, UNRESOLVED = "above", "within", "unresolved"


def roof_finding(row: dict) -> str:
    """Why a compiled row may stand above the roof its state implies: where its figures most likely come from."""
    pct = f"{row['pct_roofline']:.0f}% of its measured roof{_spread(row)}"
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


def _spread(row: dict) -> str:
    """Where the row stands over its intervals and every ceiling measured while it ran (pct_roof_low to
    pct_roof_high): above beyond the noise, or unresolved (only some ends are above)."""
    low, high = cell_float(row.get("pct_roof_low")), cell_float(row.get("pct_roof_high"))
    if not (math.isfinite(low) and math.isfinite(high)):
        return " (no interval)"
    verdict = ("above beyond the noise: at every ceiling measured while it ran and either end of its interval"
               if low > ABOVE_ROOF_PCT else "unresolved: its intervals and the ceilings of its moments straddle the "
               "roof")
    return f", {low:.0f}-{high:.0f}% over its intervals and moments ({verdict})"


def _verdict(row: dict) -> str:
    low, high = cell_float(row.get("pct_roof_low")), cell_float(row.get("pct_roof_high"))
    if not (math.isfinite(low) and math.isfinite(high)):
        return UNRESOLVED
    return ABOVE if low > ABOVE_ROOF_PCT else WITHIN if high <= ABOVE_ROOF_PCT else UNRESOLVED


def judged(row: dict) -> dict:
    """above_roof from a row's % of the roof its state implies at its moment's ceilings (compiled rows only: an
    interpreter's times are not speed), its finding in `reason` (a finding that no longer holds is cleared), and
    `roof_verdict` from pct_roof_low / pct_roof_high, which are the row's own interval at its own ceilings where no
    moments judged it (judged_at_moments)."""
    compiled = row["mode"] == "compiled" and row.get("status", "ok") == "ok"
    out = dict(row)
    pct = float(row["pct_roofline"])
    if compiled and not math.isfinite(cell_float(row.get("pct_roof_low"))):
        latency = cell_float(row.get("latency_ms"))
        ends = [cell_float(row.get(c)) for c in ("latency_ci_low_ms", "latency_ci_high_ms")]
        if all(math.isfinite(e) and e > 0 for e in ends) and math.isfinite(latency):
            out.update(pct_roof_low=pct * latency / ends[1], pct_roof_high=pct * latency / ends[0])
    above = compiled and pct > ABOVE_ROOF_PCT
    reason = roof_finding(out) if above else ("" if str(row.get("above_roof")) == "True" else row["reason"])
    return {**out, "above_roof": above, "reason": reason, "roof_verdict": _verdict(out) if compiled else ""}


def moment_name(moment: dict) -> str:
    """'before 09:25:08Z', 'round 2 09:25:31Z': what a row's roof_moment column says."""
    return f"{moment['name']} {time.strftime('%H:%M:%SZ', time.gmtime(moment['at']))}"


def at_moment(row: dict, moment: dict) -> dict | None:
    """The row with its ceiling columns, roof, bound and the least time its roof allows (`_roof_s`, not a column) at
    one moment's ceilings (a dict: name, at (epoch), read_gbps, write_gbps, copy_gbps, peak_tflops by dtype, levels);
    None where the moment lacks what its roof needs (a probe measures no cache level)."""
    peaks, compute = moment.get("peak_tflops") or {}, str(row.get("compute_dtype") or "")
    out = {**row, "read_gbps": moment["read_gbps"], "write_gbps": moment["write_gbps"],
           "peak_gbps": moment["copy_gbps"]}
    if compute and all(part in peaks for part in compute.split("+")):
        out["peak_tflops"] = compute_peak(peaks, compute)
    level = row.get("roof_level") or MEMORY
    if level in (L2, LLC):
        memory = {k: moment[k] for k in ("read_gbps", "write_gbps", "copy_gbps")}
        found = level_ceilings(moment.get("levels") or {}, memory).get(level)
        if not found:
            return None
        out.update({column: float(found[figure]) for column, figure in LEVEL_COLUMNS.items()},
                   level_note=level_notes(moment["levels"], memory).get(level, ""))
    roof_tflops, roof_s, bound, model = roof_of_row(out)
    return {**out, "roof_tflops": float(roof_tflops), "bound": str(bound), "roof_model": str(model),
            "_roof_s": float(roof_s)}


def judged_at_moments(row: dict, spans, moments: list[dict]) -> dict:
    """A row (a dict, or a CSV row's text) judged at the ceilings measured while it ran. `moments` are the run's
    measurements in time order (before it, a probe at each later round's start, after it); `spans` its ok rounds,
    each (round index, median ms, interval low, high, epoch seconds of its sampling); round k ran between moments k
    and k + 1. Its ceiling columns, roof and % of roof are those of the one moment nearest the middle of its rounds
    (`roof_moment` names it: never figures of two moments mixed); pct_roof_low and pct_roof_high span each round's
    interval at each moment around it, and set `roof_verdict`; `ceiling_drift_pct` is how far its roof moved
    between those moments. Without a span or a moment its roof holds (returned as it was)."""
    plausible = {}
    for k in sorted({i for span in spans for i in (span[0], span[0] + 1) if 0 <= i < len(moments)}):
        found = at_moment({**row, **{c: cell_float(row.get(c)) for c in FLOAT_COLUMNS if c in row}}, moments[k])
        if found is not None:
            plausible[k] = found
    if not plausible:
        return row
    middle = sorted(span[4] for span in spans)[(len(spans) - 1) // 2]
    chosen = min(plausible, key=lambda k: (abs(moments[k]["at"] - middle), k))
    out = {k: v for k, v in plausible[chosen].items() if k != "_roof_s"}
    roofs = [found["_roof_s"] for found in plausible.values()]
    out.update(roof_moment=moment_name(moments[chosen]),
               ceiling_drift_pct=100 * (max(roofs) / min(roofs) - 1) if min(roofs) > 0 else math.nan)
    if row.get("status") != "ok" or not math.isfinite(out["latency_ms"]):
        return out
    out["pct_roofline"] = float(pct_of_roof(plausible[chosen]["_roof_s"], out["latency_ms"]))
    # each round's interval at each moment around it, and the row's own figure and interval at its moment: the
    # published % of roof lies inside what the verdict reads
    row_span = (chosen, out["latency_ms"], out.get("latency_ci_low_ms", math.nan), out.get("latency_ci_high_ms",
                                                                                          math.nan))
    pairs = [(i, end) for (k, median, low, high, _) in spans for i in (k, k + 1) if i in plausible
             for end in (low if math.isfinite(low) else median, high if math.isfinite(high) else median)]
    pairs += [(chosen, end if math.isfinite(end) else row_span[1]) for end in row_span[2:]]
    ends = [float(pct_of_roof(plausible[i]["_roof_s"], end)) for i, end in pairs]
    known = all(math.isfinite(end) for span in (*spans, (0, 0, *row_span[2:])) for end in span[2:4])
    out.update(pct_roof_low=min(ends) if known else math.nan, pct_roof_high=max(ends) if known else math.nan)
    return judged(out)


MEMORY_COLUMNS = ("peak_gbps", "read_gbps", "write_gbps")
LEVEL_COLUMNS = {"level_read_gbps": "read_gbps", "level_write_gbps": "write_gbps", "level_copy_gbps": "copy_gbps"}


def with_ceiling_load(row: dict, ceil) -> dict:
    """An above-roof row's finding, with the load its ceilings were measured under where they carry a load warning
    (a roof measured while others held the CPU reads low, and the rows timed in quieter moments stand above it)."""
    load = [w for w in ceil.warnings if "under load" in w]
    if str(row.get("above_roof")) != "True" or not load:  # a flag, or a CSV cell's text
        return row
    return {**row, "reason": f"{row['reason']}; {load[0]}: they read low (PHASEBENCH_HOST_CEILINGS keeps quiet ones)"}


def judging_levels(ceil) -> dict:
    """{level: {"read_gbps", "write_gbps", "copy_gbps", "level_note"}}: the ceilings (a roofline.Ceilings) a warm row
    read from each cache level is judged at (bench.spec.roof.level_ceilings) and the note of any that a farther
    level's replaced."""
    memory = memory_figures(ceil)
    notes = level_notes(ceil.levels, memory)
    return {level: {**figures, "level_note": notes[level]}
            for level, figures in level_ceilings(ceil.levels, memory).items()}


def with_state(row: dict, state: str, levels: dict) -> dict:
    """The row with its cache state and the roof that state implies: a warm row whose footprint (its bytes) fits the
    L2 or the last-level cache is judged at the read, write and copy ceilings measured resident there (or a farther
    level's, where the level's own read below it: its `level_note` says so); every other row (cold, too large, or at
    a level without measured ceilings) at memory's."""
    level = str(roof_level(state, row["bytes"], cell_float(row.get("l2_bytes")), cell_float(row.get("llc_bytes"))))
    found = levels.get(level) if level != MEMORY else None
    out = {**row, "cache_state": state, "roof_level": level if found else MEMORY,
           **{f"level_{s}_gbps": float(found[f"{s}_gbps"]) if found else math.nan for s in ("read", "write", "copy")},
           "level_note": found.get("level_note", "") if found else ""}
    roof_tflops, _, bound, model = roof_of_row(out)
    return {**out, "roof_tflops": float(roof_tflops), "bound": str(bound), "roof_model": str(model)}
