"""The phase model's check: real forward passes of the model's dims (phasebench's own decoder, and transformers' Llama
where asked for), timed in the ops' worker process before and after the ops, beside the composition of the same."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ...analysis import phase_model as pm
from ..instruments.timing import TimerConfig
from ..spec.models import DecoderConfig
from ..sweep.worker import IN_PROCESS, Isolation, Worker

REFERENCES = ("phasebench", "transformers")
TIMERS = {"cpu": TimerConfig(warmup_s=0.1, budget_s=1.0, min_samples=5, max_samples=20, flush_l2=False),
          "cuda": TimerConfig(warmup_s=0.1, budget_s=0.5, min_samples=5, max_samples=50)}
DRIFT_PCT = 10.0  # the reference timed before and after the ops further apart than this: the machine moved
LEFT_OUT = ("embedding lookup (the reference feeds hidden states)", "host gaps between ops (Python, launches, "
            "allocation), which the composition never sees", "sampling beyond the greedy pick")
START_S = 300.0  # a worker's imports, and a decoder's weights drawn on the host


@dataclass(frozen=True)
class ReferencePlan:
    """What the check times: a prefill of `prompt` tokens (batch 1) and a decode step at `context` for each of
    `batches`, through `layers` layers, with each implementation in `kinds`."""

    model: DecoderConfig
    layers: int
    device: str
    dtype: str
    prompt: int
    batches: tuple[int, ...]
    context: int
    kinds: tuple[str, ...] = ("phasebench",)
    page_size: int = 0  # the composition's decode attention reads pages of this many tokens (0: contiguous)

    @property
    def scenarios(self) -> list[tuple[str, int, int]]:
        """(phase, batch, tokens): tokens is the prompt of a prefill, the context of a decode step."""
        return [("prefill", 1, self.prompt), *(("decode", b, self.context) for b in self.batches)]


def _decoder(kind: str, plan: ReferencePlan):
    import torch

    from ..instruments.roofline import TORCH_DTYPES

    small = dataclasses.replace(plan.model, layers=plan.layers)
    if kind == "transformers":
        from .hf_reference import HFLlama

        return HFLlama(small, plan.layers, plan.device, TORCH_DTYPES[plan.dtype])
    from .reference_decoder import ReferenceDecoder

    return ReferenceDecoder(small, plan.layers, torch.device(plan.device), TORCH_DTYPES[plan.dtype],
                            max_tokens=max(plan.prompt, plan.context + 1), max_batch=max(plan.batches))


def time_references(plan: ReferencePlan) -> list[dict]:
    """Each implementation's forward passes timed here (in the worker), watched by the contention probe; an
    implementation that cannot be built gives rows that say why."""
    import torch

    from ..instruments.contention import ContentionProbe
    from ..instruments.timing import time_call

    device = torch.device(plan.device)
    probe, timer = ContentionProbe(device), TIMERS["cuda" if device.type == "cuda" else "cpu"]
    rows = []
    for kind in plan.kinds:
        try:
            decoder = _decoder(kind, plan)
        except (ImportError, RuntimeError, ValueError) as err:
            reason = str(err).strip().splitlines()[0]
            rows += [{"reference": kind, "phase": p, "batch": b, "tokens": t, "error": reason}
                     for p, b, t in plan.scenarios]
            continue
        name = getattr(decoder, "name", "phasebench decoder (PyTorch, preallocated cache)")
        for phase, batch, tokens in plan.scenarios:
            call = functools.partial(decoder.prefill if phase == "prefill" else decoder.decode_step, batch, tokens)
            with probe.watch() as seen:
                timing = time_call(call, device, timer)
            rows.append({"reference": kind, "implementation": name, "phase": phase, "batch": batch,
                         "tokens": tokens, "ms": timing.median_ms, "samples_ms": list(timing.samples_ms),
                         "noisy": seen.noisy, "noise_reason": seen.reason})
        del decoder
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def timed(plan: ReferencePlan, isolation: Isolation = IN_PROCESS) -> list[dict]:
    """time_references in a worker of its own (isolated: the ops' worker is not running then, so the device
    is the reference's alone), or here."""
    if not isolation.isolate:
        return time_references(plan)
    worker = Worker(isolation.plugins)
    try:
        return worker.call(time_references, plan, timeout=None if isolation.case_timeout == 0 else START_S + 60 *
                           len(plan.kinds) * len(plan.scenarios), doing="timing the reference forward passes")
    finally:
        worker.close()


def reference_table(before: list[dict], after: list[dict], measured: pm.Measured, plan: ReferencePlan) -> pd.DataFrame:
    """One row per (reference, phase, batch): the reference timed before and after the ops, the median of both
    brackets' samples as reference_ms, the composition of the same layers from the measured rows, and the error
    (negative: the composition is faster than the real pass). A row is noisy when the machine was busy during
    either bracket, or when the brackets' medians lie more than DRIFT_PCT apart (the machine moved meanwhile)."""
    small = dataclasses.replace(plan.model, layers=plan.layers)
    later = {(r["reference"], r["phase"], r["batch"]): r for r in after}
    rows = []
    for first in before:
        key = (first["reference"], first["phase"], first["batch"])
        second = later.get(key, {})
        if first["phase"] == "prefill":
            composed = pm.ttft(measured, small, first["tokens"])
        else:
            composed = pm.tpot(measured, small, first["batch"], first["tokens"], plan.page_size)
        samples = [*first.get("samples_ms", ()), *second.get("samples_ms", ())]
        reference_ms = float(np.median(samples)) if samples else float("nan")
        reasons = [r["noise_reason"] for r in (first, second) if r.get("noisy") and r.get("noise_reason")]
        drift = pm.model_error(second["ms"], first["ms"]) if first.get("ms") and second.get("ms") else float("nan")
        if abs(drift) > DRIFT_PCT:
            reasons.append(f"the reference moved {drift:+.0f}% between before and after the ops")
        rows.append({"reference": first["reference"], "implementation": first.get("implementation", ""),
                     "phase": first["phase"], "layers": plan.layers, "batch": first["batch"],
                     "tokens": first["tokens"], "reference_ms": reference_ms,
                     "reference_before_ms": first.get("ms"), "reference_after_ms": second.get("ms"),
                     "drift_pct": drift,
                     "reference_p20_ms": float(np.percentile(samples, 20)) if samples else float("nan"),
                     "reference_p80_ms": float(np.percentile(samples, 80)) if samples else float("nan"),
                     "samples": len(samples), "noisy": bool(reasons),
                     "noise_reason": "; ".join(dict.fromkeys(reasons)),
                     "composed_ms": composed.total_ms, "error_pct": pm.model_error(composed.total_ms, reference_ms),
                     "error": first.get("error", ""), "left_out": "; ".join(LEFT_OUT)})
    return pd.DataFrame(rows)
