"""Ceilings at the moments of a run: measured before it and again after it, probed at the start of each later round,
the spread between them flagged; each row is judged at the moment it ran (bench.spec.roof_verdict)."""

from __future__ import annotations

import dataclasses
import math

import torch

from .ceiling_measures import (
    STREAM_KERNELS,
    STREAMS,
    TORCH_DTYPES,
    StreamBuffers,
    measure_levels,
    measure_matmul,
    measure_stream,
    measure_streams,
    with_provenance,
)
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
from .timing import TimerConfig

DRIFT_FLAG = 0.05  # a figure that moved by more than this over the run's measurements is named in a warning
# a round's probe: each stream by one kernel, each matmul at its size, five samples at least (each kept by its best)
ROUND_PROBE_TIMER = TimerConfig(warmup_s=0.02, budget_s=0.12, min_samples=5, max_samples=50, flush_l2=False)


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


def moment(ceil: Ceilings, name: str, at: float) -> dict:
    """One measurement of the ceilings as a moment of the run (bench.spec.roof_verdict.judged_at_moments): its name,
    when (`at`, epoch seconds: the middle of the measurement, or when a cached entry was held against its probe),
    the streams, the matmuls and the cache levels."""
    return {"name": name, "at": at, "read_gbps": ceil.read_gbps, "write_gbps": ceil.write_gbps,
            "copy_gbps": ceil.copy_gbps, "peak_tflops": dict(ceil.peak_tflops),
            "levels": {k: {f"{s}_gbps": float(v[f"{s}_gbps"]) for s in STREAMS} for k, v in ceil.levels.items()},
            "warnings": list(ceil.warnings)}


def probe_moment(device: torch.device, before: Ceilings, name: str) -> dict:
    """A short measurement of the ceilings at the start of a round: each stream by the kernel that was fastest in
    `before` and each matmul at its size, on the probe's short timer and by the same statistic (the best sample); no
    cache level (a warm row at a level is judged at the moments that measured it)."""
    kernels = {s: (before.bandwidth.get(s) or {}).get("kernel") or STREAM_KERNELS[s][0] for s in STREAMS}
    sizes = {d: n for d, n in before.matmul_n.items() if d in TORCH_DTYPES}

    def measure_all():
        buffers = StreamBuffers(device)
        streams = {s: measure_stream(device, s, ROUND_PROBE_TIMER, buffers, kernels=(kernels[s],))
                   for s in STREAMS}
        del buffers
        return streams, {d: measure_matmul(device, d, ROUND_PROBE_TIMER, n=n) for d, n in sizes.items()}

    with on_device(device):
        (streams, tflops), provenance = with_provenance(device, measure_all)
    return {"name": name, "at": provenance["measured_at_epoch"] + provenance["duration_s"] / 2,
            **{f"{s}_gbps": streams[s]["gbps"] for s in STREAMS}, "peak_tflops": tflops, "levels": {},
            "duration_s": provenance["duration_s"], "kernels": kernels,
            "warnings": load_warnings(provenance["conditions"], f"the {name} probe")}


def spread(moments: list[dict]) -> dict[str, float]:
    """max / min - 1 of each stream and matmul over the run's moments: how far the machine moved during the run."""
    names = [f"{s}_gbps" for s in STREAMS]
    values = {n: [m[n] for m in moments if math.isfinite(m.get(n, math.nan))] for n in names}
    for m in moments:
        for d, tf in m["peak_tflops"].items():
            values.setdefault(f"matmul {d}", []).append(tf)
    return {n: max(v) / min(v) - 1 for n, v in values.items() if len(v) > 1 and min(v) > 0}


def drift_warning(moments: list[dict]) -> str | None:
    """One line naming the figures that moved by more than DRIFT_FLAG over the run's moments, or None."""
    moved = {k: v for k, v in spread(moments).items() if v > DRIFT_FLAG}
    if not moved:
        return None
    named = ", ".join(f"{k} {v:.0%}" for k, v in sorted(moved.items(), key=lambda kv: -kv[1]))
    return (f"ceilings moved during the run (highest over lowest of {len(moments)} measurements: {named}): each row "
            "is judged at the measurement nearest its rounds, its roof_verdict over all those around them")


def record(before: Ceilings, after: Ceilings | None, why: str) -> dict:
    """What run.json keeps of the run's ceilings besides `ceilings` (the ones measured before it)."""
    if after is None:
        return {"ceilings_after": None, "ceilings_after_note": why, "ceiling_drift": {}}
    return {"ceilings_after": after.to_json(), "ceilings_after_note": why,
            "ceiling_drift": {k: round(v, 4) for k, v in drift(before, after).items()},
            "ceilings_used": "each row at the measurement nearest its rounds (before, a round's probe, after)"}
