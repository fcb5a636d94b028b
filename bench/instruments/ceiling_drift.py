"""Ceilings that hold for a run: measured again after it, both kept, the drift between them flagged, and every figure
the higher of the two, which the run's rows are judged against."""

from __future__ import annotations

import dataclasses
import math

import torch

from ..spec.roof import level_ceilings
from .ceiling_measures import STREAMS, TORCH_DTYPES, measure_levels, measure_matmul, measure_streams, with_provenance
from .conditions import load_warnings
from .roofline import (
    CEILING_TIMER,
    HOST_CEILING_TIMER,
    HOST_LEVEL_TIMER,
    HOST_STREAM_TIMER,
    Ceilings,
    host_keep_dir,
    on_device,
)

DRIFT_FLAG = 0.05  # a figure that moved by more than this between the two measurements is named in a warning


def measure_again(device: torch.device, before: Ceilings) -> tuple[Ceilings | None, str]:
    """The ceilings of `before` measured again (the streams, the cache levels, each matmul at the size measured
    before), or None and why not: ceilings kept in PHASEBENCH_HOST_CEILINGS judge every run by request."""
    if device.type != "cuda" and host_keep_dir() is not None:
        return None, f"not measured again: the host's ceilings are kept in {host_keep_dir()} for every run"
    gpu = device.type == "cuda"
    matmul_timer = CEILING_TIMER if gpu else HOST_CEILING_TIMER
    sizes = {d: n for d, n in before.matmul_n.items() if d in TORCH_DTYPES}

    def measure_all():
        streams = measure_streams(device, CEILING_TIMER if gpu else HOST_STREAM_TIMER)
        levels = measure_levels(device, HOST_LEVEL_TIMER) if before.levels else {}
        return streams, levels, {d: measure_matmul(device, d, matmul_timer, n=n) for d, n in sizes.items()}

    with on_device(device):
        (streams, levels, tflops), provenance = with_provenance(device, measure_all)
    after = dataclasses.replace(
        before, peak_gbps=streams["copy"]["gbps"], read_gbps=streams["read"]["gbps"],
        write_gbps=streams["write"]["gbps"], bandwidth=streams, levels=levels,
        peak_tflops={**before.peak_tflops, **tflops}, source="measured", measured_at=provenance["measured_at"],
        age_s=0.0, duration_s=provenance["duration_s"], conditions=provenance["conditions"], added={},
        checked="measured again after the run", warnings=load_warnings(provenance["conditions"]))
    return after, after.checked


def figures(ceil: Ceilings) -> dict[str, float]:
    """Every figure a row can be judged against, by name: the memory streams, each level's, each matmul."""
    found = {"read_gbps": ceil.read_gbps, "write_gbps": ceil.write_gbps, "copy_gbps": ceil.copy_gbps}
    for level, values in ceil.levels.items():
        found.update({f"{level} {s}_gbps": float(values[f"{s}_gbps"]) for s in STREAMS})
    found.update({f"matmul {d}": tf for d, tf in ceil.peak_tflops.items()})
    return found


def drift(before: Ceilings, after: Ceilings) -> dict[str, float]:
    """after / before - 1 of each figure measured both times."""
    then, now = figures(before), figures(after)
    return {k: now[k] / then[k] - 1 for k in then if k in now and then[k] and math.isfinite(then[k] * now[k])}


def higher(before: Ceilings, after: Ceilings | None) -> Ceilings:
    """`before` with each figure the higher of the two measurements, and a warning naming the figures that drifted by
    more than DRIFT_FLAG (and any load the second was measured under)."""
    if after is None:
        return before
    levels = {level: {**values, **{f"{s}_gbps": max(float(values[f"{s}_gbps"]),
                                                      float(after.levels[level][f"{s}_gbps"])) for s in STREAMS}}
              for level, values in before.levels.items() if level in after.levels}
    moved = {k: v for k, v in drift(before, after).items() if abs(v) > DRIFT_FLAG}
    warnings = [*before.warnings, *(w.replace("ceilings", "ceilings after the run", 1) for w in after.warnings)]
    if moved:
        named = ", ".join(f"{k} {v:+.0%}" for k, v in sorted(moved.items(), key=lambda kv: -abs(kv[1])))
        warnings.append(f"ceilings drifted during the run ({named} after against before): rows judged against the "
                        "higher of each")
    return dataclasses.replace(
        before, peak_gbps=max(before.peak_gbps, after.peak_gbps), read_gbps=max(before.read_gbps, after.read_gbps),
        write_gbps=max(before.write_gbps, after.write_gbps), levels={**before.levels, **levels},
        peak_tflops={d: max(tf, after.peak_tflops.get(d, tf)) for d, tf in before.peak_tflops.items()},
        warnings=warnings, checked=f"{before.checked}; the higher of each figure measured before and after the run")


def _level_ceilings(ceil: Ceilings) -> dict:
    memory = {"read_gbps": ceil.read_gbps, "write_gbps": ceil.write_gbps, "copy_gbps": ceil.copy_gbps}
    return level_ceilings(ceil.levels, memory)


def substitutions(before: Ceilings, used: Ceilings, after: Ceilings | None) -> dict:
    """What a row judged against `before` is judged against now, with each figure's drift: "values", {a figure's
    value before: (its value used, its drift)}, found by value (a row carries the figures, not their names); and
    "levels", {level: {figure: (value used, drift)}} of the ceilings a warm row at that level is judged at; and
    "matmuls", {dtype: drift} of each matmul ceiling (a row's compute ceiling is recomputed for its compute dtype)."""
    then, now = figures(before), figures(used)
    moved = drift(before, after) if after is not None else {}
    values = {value: (now[name], moved.get(name, math.nan)) for name, value in then.items() if name in now}
    was, new, later = _level_ceilings(before), _level_ceilings(used), _level_ceilings(after) if after else {}
    levels = {level: {k: (new[level][k], later[level][k] / v - 1 if level in later and v else math.nan)
                      for k, v in figures.items()} for level, figures in was.items() if level in new}
    matmuls = {d: moved.get(f"matmul {d}", math.nan) for d in used.peak_tflops}
    return {"values": values, "levels": levels, "matmuls": matmuls}


def record(before: Ceilings, after: Ceilings | None, why: str) -> dict:
    """What run.json keeps of the run's ceilings besides `ceilings` (the ones measured before it)."""
    if after is None:
        return {"ceilings_after": None, "ceilings_after_note": why, "ceiling_drift": {}}
    return {"ceilings_after": after.to_json(), "ceilings_after_note": why,
            "ceiling_drift": {k: round(v, 4) for k, v in drift(before, after).items()},
            "ceilings_used": "the higher of each figure before and after the run"}
