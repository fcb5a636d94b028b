"""The phase model's check: real forward passes of the model's dims (phasebench's own decoder, and transformers' Llama
where asked for) timed in brackets interleaved with rounds of the ops they compose to, on the ops' own worker, so
that both sides see the same machine."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ...analysis.phases import model as pm
from ..instruments.timing import TimerConfig
from ..spec import steps as step_defs
from ..spec.models import DecoderConfig
from ..sweep.runner import RunConfig, impls_for, run
from ..sweep.worker import IN_PROCESS, Executor, Isolation, WorkerError, release_case

REFERENCES = ("phasebench", "transformers")
# one bracket's sampling; every bracket's samples are pooled, so a bracket needs few
TIMERS = {"cpu": TimerConfig(warmup_s=0.1, budget_s=0.5, min_samples=3, max_samples=20, flush_l2=False),
          "cuda": TimerConfig(warmup_s=0.1, budget_s=0.25, min_samples=5, max_samples=50)}
ROUNDS = 5  # rounds of the ops, bracketed by ROUNDS + 1 timings of the reference
SPREAD_PCT = 10.0  # the rounds' errors with an interquartile range above this: they disagree, not believable
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
    weights: str = ""  # the layers' projections packed by this scheme ("": the activation dtype)
    weights_impl: str = "torch"  # the qlinear impl that runs them, in the composition and the real pass alike

    @property
    def scenarios(self) -> list[tuple[str, int, int]]:
        """(phase, batch, tokens): tokens is the prompt of a prefill, the context of a decode step."""
        return [("prefill", 1, self.prompt), *(("decode", b, self.context) for b in self.batches)]

    @property
    def small(self) -> DecoderConfig:
        """The model cut to the layers the reference runs."""
        return dataclasses.replace(self.model, layers=self.layers)

    def composed(self, measured: pm.Measured, phase: str, batch: int, tokens: int) -> pm.StepTime:
        """The composition of one scenario from measured rows."""
        if phase == "prefill":
            return pm.ttft(measured, self.small, tokens)
        return pm.tpot(measured, self.small, batch, tokens, self.page_size)

    def uses(self) -> list[step_defs.OpUse]:
        """Every op the scenarios' compositions sum, once."""
        steps = [step_defs.prefill_step(self.small, self.prompt),
                 *(step_defs.decode_step(self.small, b, self.context, self.page_size) for b in self.batches)]
        return step_defs.distinct_uses(step_defs.with_weights(step, self.weights) for step in steps)


def _decoder(kind: str, plan: ReferencePlan):
    from ..instruments.roofline import TORCH_DTYPES

    if kind == "transformers":
        from .hf_reference import HFLlama

        return HFLlama(plan.small, plan.layers, plan.device, TORCH_DTYPES[plan.dtype])
    from .reference_decoder import ReferenceDecoder

    return ReferenceDecoder(plan.small, plan.layers, torch.device(plan.device), TORCH_DTYPES[plan.dtype],
                            max_tokens=max(plan.prompt, plan.context + 1), max_batch=max(plan.batches),
                            weights=plan.weights, weights_impl=plan.weights_impl)


_BUILT: dict = {}  # (kind, plan) -> the decoder (or why it cannot be built), kept across one check's brackets


def _built(kind: str, plan: ReferencePlan):
    key = (kind, plan)
    if key not in _BUILT:
        try:
            _BUILT[key] = _decoder(kind, plan)
        except (ImportError, RuntimeError, ValueError) as err:
            _BUILT[key] = str(err).strip().splitlines()[0]
    return _BUILT[key]


def time_bracket(plan: ReferencePlan, bracket: int, last: bool) -> list[dict]:
    """Each implementation's forward passes timed here, watched by the contention probe: one row per (kind,
    scenario) of this bracket; an implementation that cannot be built gives rows that say why. The decoders are
    built at the first bracket and freed after the last; the ops' last case is freed first (its inputs would crowd
    the reference's memory), and the implementations take turns at going first (the first after the ops is
    timed in other conditions than the second)."""
    from ..instruments.contention import ContentionProbe
    from ..instruments.timing import time_call

    device = torch.device(plan.device)
    probe, timer = ContentionProbe(device), TIMERS["cuda" if device.type == "cuda" else "cpu"]
    release_case()
    rows = []
    try:
        for kind in plan.kinds if bracket % 2 == 0 else plan.kinds[::-1]:
            decoder = _built(kind, plan)
            if isinstance(decoder, str):
                rows += [{"reference": kind, "bracket": bracket, "phase": p, "batch": b, "tokens": t,
                          "error": decoder} for p, b, t in plan.scenarios]
                continue
            name = getattr(decoder, "name", "phasebench decoder (PyTorch, preallocated cache)")
            for phase, batch, tokens in plan.scenarios:
                step = decoder.prefill if phase == "prefill" else decoder.decode_step
                with probe.watch() as seen:
                    timing = time_call(functools.partial(step, batch, tokens), device, timer)
                rows.append({"reference": kind, "implementation": name, "bracket": bracket, "phase": phase,
                             "batch": batch, "tokens": tokens, "ms": timing.median_ms,
                             "samples_ms": list(timing.samples_ms), "noisy": seen.noisy,
                             "noise_reason": seen.reason})
    finally:
        if last:
            _BUILT.clear()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def run_check(plan: ReferencePlan, cases, impls: dict, out_dir: Path, *, timer: TimerConfig,
              isolation: Isolation = IN_PROCESS, rounds: int = ROUNDS, time_budget_s: float | None = None,
              started: float | None = None, on_row=None) -> tuple[list[dict], pd.DataFrame]:
    """The ops of the plan's compositions measured `rounds` times into out_dir (a run folder of suite
    phases-check), the reference timed before each round and after the last, on the same worker. Returns the
    brackets' rows and the ops' rows in the order measured."""
    brackets: list[dict] = []

    def between(executor: Executor, k: int) -> None:
        try:
            brackets.extend(executor.call(time_bracket, plan, k, k == rounds, timeout=None if isolation.case_timeout
                                          == 0 else START_S + 60 * len(plan.kinds) * len(plan.scenarios),
                                          doing="timing the reference forward passes"))
        except WorkerError as err:
            brackets.extend({"reference": kind, "bracket": k, "phase": p, "batch": b, "tokens": t, "error": str(err)}
                            for kind in plan.kinds for p, b, t in plan.scenarios)

    rows = run(RunConfig(list(cases), impls, torch.device(plan.device), out_dir, suite="phases-check", timer=timer,
                         isolation=isolation, rounds=rounds, between_rounds=between, time_budget_s=time_budget_s,
                         started=started, on_row=on_row))
    return brackets, rows


def rounds_of(rows: pd.DataFrame, cases, impls: dict, rounds: int) -> list[pd.DataFrame]:
    """The ops' rows split by round (each round appends one row per (case, impl), in the same order)."""
    per_round = sum(len(impls_for(case, impls)) for case in cases)
    if per_round == 0 or len(rows) != per_round * rounds:
        return []
    return [rows.iloc[k * per_round:(k + 1) * per_round] for k in range(rounds)]


def _median(rows: list[dict]) -> float:
    samples = [s for r in rows for s in r.get("samples_ms", ())]
    return float(np.median(samples)) if samples else float("nan")


def reference_table(brackets: list[dict], measured: pm.Measured, per_round: list[pm.Measured],
                    plan: ReferencePlan) -> pd.DataFrame:
    """One row per (reference, phase, batch): the median of every bracket's samples as reference_ms, the
    composition of the same layers from the median of each op over the rounds, and the error (negative: the
    composition is faster than the real pass). Each round is also composed on its own against its two brackets; a
    row is noisy when the rounds' errors have an interquartile range above SPREAD_PCT points, or when most brackets
    saw a busy machine. drift_pct says how far the reference moved from the first bracket to the last."""
    rows = []
    for key in dict.fromkeys((b["reference"], b["phase"], b["batch"], b["tokens"]) for b in brackets):
        kind, phase, batch, tokens = key
        mine = sorted((b for b in brackets if (b["reference"], b["phase"], b["batch"], b["tokens"]) == key),
                      key=lambda b: b["bracket"])
        timed = [b for b in mine if b.get("ms")]
        samples = [s for b in timed for s in b.get("samples_ms", ())]
        reference_ms = _median(timed)
        composed = plan.composed(measured, phase, batch, tokens).total_ms
        errors = []
        for k, round_rows in enumerate(per_round):
            around = _median([b for b in timed if b["bracket"] in (k, k + 1)])
            errors.append(pm.model_error(plan.composed(round_rows, phase, batch, tokens).total_ms, around))
        errors = [e for e in errors if np.isfinite(e)]
        reasons = []
        busy = [b for b in timed if b.get("noisy")]
        if timed and 2 * len(busy) > len(timed):
            reasons.append(f"busy in {len(busy)} of {len(timed)} brackets ({busy[0].get('noise_reason', '')})")
        spread = float(np.subtract(*np.percentile(errors, [75, 25]))) if errors else 0.0
        if spread > SPREAD_PCT:
            reasons.append(f"the rounds disagree: errors {min(errors):+.0f}% to {max(errors):+.0f}%, interquartile "
                           f"range {spread:.0f} points")
        drift = pm.model_error(timed[-1]["ms"], timed[0]["ms"]) if len(timed) > 1 else float("nan")
        rows.append({"reference": kind, "implementation": next((b["implementation"] for b in timed), ""),
                     "phase": phase, "layers": plan.layers, "batch": batch, "tokens": tokens,
                     "reference_ms": reference_ms,
                     "reference_p20_ms": float(np.percentile(samples, 20)) if samples else float("nan"),
                     "reference_p80_ms": float(np.percentile(samples, 80)) if samples else float("nan"),
                     "samples": len(samples), "brackets": len(timed), "rounds": len(per_round), "drift_pct": drift,
                     "round_error_min_pct": min(errors) if errors else float("nan"),
                     "round_error_max_pct": max(errors) if errors else float("nan"),
                     "noisy": bool(reasons), "noise_reason": "; ".join(reasons),
                     "composed_ms": composed, "error_pct": pm.model_error(composed, reference_ms),
                     "error": next((b["error"] for b in mine if b.get("error")), ""), "left_out": "; ".join(LEFT_OUT)})
    return pd.DataFrame(rows)


def brackets_table(brackets: list[dict]) -> pd.DataFrame:
    """The brackets in long form (one row per bracket, reference and scenario), samples counted."""
    keep = ("reference", "bracket", "phase", "batch", "tokens", "ms", "noisy", "noise_reason", "error")
    return pd.DataFrame([{**{k: b.get(k) for k in keep}, "samples": len(b.get("samples_ms", ()))} for b in brackets])
