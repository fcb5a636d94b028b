"""The phase model's check: real forward passes of the model's dims (phasebench's own decoder, and transformers' Llama,
Mixtral for a mixture of experts, DeepseekV2 for MLA or GptOss for windows and sinks, where asked for) timed in
brackets interleaved with rounds of the ops they compose to, on the ops' own worker, so that both sides see the same
machine."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import torch

from ...analysis.phases.check import ReferencePlan
from ..instruments.timing import TimerConfig
from ..sweep.executor import Executor
from ..sweep.runner import RunConfig, impls_for, run
from ..sweep.worker import IN_PROCESS, Isolation, WorkerError, release_case

REFERENCES = ("phasebench", "transformers")
# one bracket's sampling: each round is judged against the medians of its two brackets, so a bracket takes at
# least 5 samples (a median within about 2% on the host)
TIMERS = {"cpu": TimerConfig(warmup_s=0.1, budget_s=0.5, min_samples=5, max_samples=20, flush_l2=False),
          "cuda": TimerConfig(warmup_s=0.1, budget_s=0.25, min_samples=5, max_samples=50)}
ROUNDS = 5  # rounds of the ops, bracketed by ROUNDS + 1 timings of the reference
START_S = 300.0  # a worker's imports, and a decoder's weights drawn on the host


def _decoder(kind: str, plan: ReferencePlan):
    from ..instruments.roofline import TORCH_DTYPES

    deep = max(plan.depths)  # built once at 2L layers; the shallower passes run the first layers of them
    if kind == "transformers":
        from .hf_reference import HFReference

        return HFReference(plan.cut(deep), deep, plan.device, TORCH_DTYPES[plan.dtype])
    from .reference_decoder import ReferenceDecoder

    return ReferenceDecoder(plan.cut(deep), deep, torch.device(plan.device), TORCH_DTYPES[plan.dtype],
                            max_tokens=max(t + (p == "decode") for p, _, t in (*plan.scenarios, *plan.zero_layer_only)),
                            max_batch=max(b for _, b, _ in (*plan.scenarios, *plan.zero_layer_only)),
                            weights=plan.weights, weights_impl=plan.weights_impl, moe_impl=plan.moe_impl,
                            experts=plan.experts,
                            impls={"attention": plan.attention_impl, "mla": plan.mla_impl})


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
    scenario, depth) of this bracket, at 0, L and 2L layers of one decoder (the per-layer check), and phasebench's
    decoder at 0 layers for each published scenario the check does not time (their per-iteration cost); an
    implementation
    that cannot be built gives rows that say why. The decoders are built at the first bracket and freed after the
    last; the ops' last case is freed first (its inputs would crowd the reference's memory), and the
    implementations, and the depths, take turns at going first (the first after the ops is timed in other
    conditions than the second)."""
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
                rows += [{"reference": kind, "bracket": bracket, "phase": p, "batch": b, "tokens": t, "layers": depth,
                          "error": decoder} for p, b, t in plan.scenarios for depth in plan.depths]
                continue
            name = getattr(decoder, "name", "phasebench decoder (PyTorch, preallocated cache)")
            for phase, batch, tokens in plan.scenarios:
                step = decoder.prefill if phase == "prefill" else decoder.decode_step
                for depth in plan.depths if bracket % 2 == 0 else plan.depths[::-1]:
                    with probe.watch() as seen:
                        timing = time_call(functools.partial(step, batch, tokens, depth=depth), device, timer)
                    rows.append({"reference": kind, "implementation": name, "bracket": bracket, "phase": phase,
                                 "batch": batch, "tokens": tokens, "layers": depth, "ms": timing.median_ms,
                                 "samples_ms": list(timing.samples_ms), "noisy": seen.noisy,
                                 "noise_reason": seen.reason})
            if kind == "phasebench":  # the published steps' per-iteration cost: their zero-layer passes
                for phase, batch, tokens in plan.zero_layer_only:
                    step = decoder.prefill if phase == "prefill" else decoder.decode_step
                    timing = time_call(functools.partial(step, batch, tokens, depth=0), device, timer)
                    rows.append({"reference": kind, "implementation": name, "bracket": bracket, "phase": phase,
                                 "batch": batch, "tokens": tokens, "layers": 0, "ms": timing.median_ms,
                                 "samples_ms": list(timing.samples_ms)})
    finally:
        if last:
            _BUILT.clear()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def run_check(plan: ReferencePlan, cases, impls: dict, out_dir: Path, *, timer: TimerConfig,
              isolation: Isolation = IN_PROCESS, rounds: int = ROUNDS, time_budget_s: float | None = None,
              started: float | None = None, on_row=None,
              first: Callable[[Executor], None] | None = None) -> tuple[list[dict], pd.DataFrame]:
    """The ops of the plan's compositions measured `rounds` times into out_dir (a run folder of suite
    phases-check), the reference timed before each round and after the last, on the same worker; `first` runs on
    that worker before the first bracket. Returns the brackets' rows and the ops' rows in the order measured."""
    brackets: list[dict] = []

    def between(executor: Executor, k: int) -> None:
        if k == 0 and first is not None:
            first(executor)
        try:
            passes = len(plan.kinds) * len(plan.scenarios) * len(plan.depths) + len(plan.zero_layer_only)
            brackets.extend(executor.call(time_bracket, plan, k, k == rounds, timeout=None if isolation.case_timeout
                                          == 0 else START_S + 60 * passes, doing="timing the reference forward passes"))
        except WorkerError as err:
            brackets.extend({"reference": kind, "bracket": k, "phase": p, "batch": b, "tokens": t, "layers": depth,
                             "error": str(err)} for kind in plan.kinds for p, b, t in plan.scenarios
                            for depth in plan.depths)

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


def brackets_table(brackets: list[dict]) -> pd.DataFrame:
    """The brackets in long form (one row per bracket, reference and scenario), samples counted."""
    keep = ("reference", "bracket", "phase", "batch", "tokens", "layers", "ms", "noisy", "noise_reason", "error")
    return pd.DataFrame([{**{k: b.get(k) for k in keep}, "samples": len(b.get("samples_ms", ()))} for b in brackets])
