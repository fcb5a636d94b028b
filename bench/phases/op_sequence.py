"""A step's ops called back to back in the step's order, as a forward pass runs them: one layer's ops (each as often
as a layer runs it) and the head's, timed as one call on the ops' worker, and each op alone on the same inputs, in
turns of alone, sequence, sequence, alone (ABBA: a drift linear over a turn cancels in it). Each turn gives one effect:
sequence / alone on the host, sequence - alone on a GPU (where launch gaps add rather than scale); the phase model
applies the term only where the effects' interval excludes no effect (analysis.phases.sequence).

On the host the streamed operands (weights, the KV cache) are cold as in the sweep: alone, each op takes the sweep's
own plan (copies in turn, or an eviction); in sequence, the calls take turns over copies of the whole layer's
streamed operands, enough that 2 x the last-level cache streams between two reads of one copy (or, for a layer too
small for that, 2 x LLC written before each sequence). A GPU flushes L2 before each call, alone and in sequence;
CUDA events around the sequence count the gaps where the host falls behind.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import numpy as np
import torch

from ...analysis.phases import model as pm
from ...analysis.phases.sequence import effects_text, turn_effect
from ..instruments import cold as cold_operands
from ..instruments.memory.host_cache import evictor
from ..instruments.timing import TimerConfig, time_call
from ..ops.attention.cases import AttentionCase
from ..ops.elementwise.cases import ElementwiseCase
from ..ops.linear.cases import LinearCase
from ..ops.mla.cases import MLACase
from ..ops.moe.cases import MoeCase
from ..ops.qlinear.cases import QLinearCase
from ..spec import steps as step_defs
from ..sweep.measure import CaseState, impl_mode, one_line

CASE_TYPES = {"attention": AttentionCase, "linear": LinearCase, "elementwise": ElementwiseCase,
              "qlinear": QLinearCase, "moe": MoeCase, "mla": MLACase}
# ABBA turns per sequence: 6, so that a shape's own effects hold their median with 95% (the extremes of 6 do)
TURNS = 6
FORMS = {"cpu": "ratio", "cuda": "difference"}  # per device kind: how a turn's two sides make its effect
COLUMNS = ("key", "sequence", "phase", "m", "ops", "sequence_ms", "sequence_p20_ms", "sequence_p80_ms", "alone_ms",
           "term_ms", "term_pct", "form", "turns", "turn_effects", "samples", "copies", "cold", "noisy",
           "noise_reason", "status", "reason", "uses")


def case_of(use: step_defs.OpUse, dtype: str, model: str):
    """The measured case an OpUse names: its operator's case type built from the use's fields."""
    return CASE_TYPES[use.op](**use.field_dict, dtype=dtype, model=model)


def distinct_sequences(steps) -> list[tuple[str, list[step_defs.OpUse]]]:
    """(kind, uses) of every layer and head that the steps run, once each, layers first: the head's lm_head weight
    is the largest operand, so it is held after the layers' copies are freed."""
    found: dict[str, tuple[str, list]] = {}
    for step in steps:
        for kind, _, uses in pm.sequence_parts(step):
            found.setdefault(pm.sequence_key(uses), (kind, uses))
    return sorted(found.values(), key=lambda item: item[0] != "layer")


def failed(kind: str, uses: list, reason: str) -> dict:
    """The row of a sequence that could not be timed (a worker that died or hung)."""
    return _row(kind, uses, status="failed", reason=reason)


def _row(kind: str, uses: list, **values) -> dict:
    first = uses[0].field_dict
    row = {"key": pm.sequence_key(uses), "sequence": kind, "phase": first.get("phase", ""), "m": first.get("m"),
           "ops": sum(u.count for u in uses), "status": "ok", "reason": "", "noisy": False, "noise_reason": "",
           "uses": "; ".join(f"{u.count} x {u.op} {u.label}" for u in uses)}
    return {**row, **values}


def _median(calls, device, timer, probe, seen_noisy: list, evict=None) -> tuple[float, list[float]]:
    with probe.watch() as seen:
        timing = time_call(calls, device, timer, evict=evict)
    if seen.noisy:
        seen_noisy.append(seen.reason)
    return timing.median_ms, list(timing.samples_ms)


def time_sequence(kind: str, uses: list, dtype: str, model: str, impls: dict, device: torch.device,
                  timer: TimerConfig, probe, cold: bool = True) -> dict:
    """One row: the sequence's median, the sum of its ops' medians alone (count x each), and the term between them;
    `cold`: the host's streamed operands cold, as the sweep timed them (its timer's `cold`)."""
    modes = {impl_mode(impls[u.op]) for u in uses}
    if modes != {"compiled"}:
        return _row(kind, uses, status="skipped", reason="an impl runs in an interpreter: its timings are not "
                                                         "performance")
    states = [CaseState(case_of(u, dtype, model), device) for u in uses]
    alone_calls, cold = [], cold and device.type == "cpu"
    operands = [getattr(s.inputs, n) for s in states for n in s.op.streamed]
    copies = cold_operands.rotation(cold_operands.nbytes(operands), device, cold_operands.clone_nbytes(operands)) \
        if cold else 1
    evict = evictor() if not copies else None  # small layers: 2 x LLC written before each sequence, as alone
    copies = max(copies, 1)
    rotations = []
    for state, use in zip(states, uses, strict=True):
        impl = impls[use.op]
        call = state.op.prepare(state.case, state.inputs, impl)
        alone_calls.append(cold_operands.plan(state, impl, call, cold=cold, mode="compiled"))
        names = tuple(state.op.streamed)
        inputs = [state.inputs, *(state.cold_copies(names, copies) if names and copies > 1 else ())]
        rotations.append([state.op.prepare(state.case, x, impl).run for x in inputs])

    def in_sequence(turn: int):
        def run():
            for calls, use in zip(rotations, uses, strict=True):
                for _ in range(use.count):
                    calls[turn % len(calls)]()
        return run

    sequence_calls = [in_sequence(turn) for turn in range(copies)]
    busy: list[str] = []
    alone, sequence, effects, samples = [], [], [], []
    form = FORMS["cuda" if device.type == "cuda" else "cpu"]

    def alone_ms() -> float:
        return sum(use.count * _median(planned.calls, device, timer, probe, busy, planned.evict)[0]
                   for planned, use in zip(alone_calls, uses, strict=True))

    def sequence_ms() -> float:
        median, found = _median(sequence_calls, device, timer, probe, busy, evict)
        samples.extend(found)
        return median

    for _ in range(TURNS):  # A B B A
        first, seq = alone_ms(), sequence_ms()
        seq, last = (seq + sequence_ms()) / 2, alone_ms()
        alone.append((first + last) / 2)
        sequence.append(seq)
        effects.append(turn_effect(alone[-1], seq, form))
    sequence_med, alone_med, effect = (statistics.median(v) for v in (sequence, alone, effects))
    term = (effect - 1) * alone_med if form == "ratio" else effect
    return _row(kind, uses, sequence_ms=sequence_med, alone_ms=alone_med, term_ms=term, term_pct=100 * term / alone_med,
                form=form, turns=TURNS, turn_effects=effects_text(effects), samples=len(samples),
                sequence_p20_ms=float(np.percentile(samples, 20)), sequence_p80_ms=float(np.percentile(samples, 80)),
                copies=copies, cold=cold, noisy=2 * len(busy) > TURNS * 2 * (len(uses) + 1),
                noise_reason=busy[0] if busy else "")


def sequence_timer(sweep: TimerConfig) -> TimerConfig:
    """The sweep's L2 flush and cold operands, each timing of a turn warmed by its first call only and of 2 or 3
    samples (no interval target: the turns make the interval), so that a layer's six turns stay within seconds."""
    return dataclasses.replace(sweep, warmup_s=0.0, warmup_calls=1, min_samples=2, max_samples=3, target=0.0,
                               min_time_s=0.0, budget_s=min(sweep.budget_s, 0.05))


def time_sequences(sequences, dtype: str, model: str, impls: dict, device: str, timer: TimerConfig,
                   budget_end: float | None = None) -> list[dict]:
    """Every sequence's row, on this worker, sampled as the sweep was (`timer`: its cold operands too); one that
    fails or cannot run costs its row, and sequences past `budget_end` (time.monotonic()) are skipped."""
    from ..instruments.contention import ContentionProbe
    from ..sweep.worker import release_case

    device = torch.device(device)
    cold, timer, probe = timer.cold, sequence_timer(timer), ContentionProbe(device)
    release_case()  # the sweep's last case would crowd the sequences' copies
    rows = []
    for kind, uses in sequences:
        if budget_end is not None and time.monotonic() > budget_end:
            rows.append(_row(kind, uses, status="skipped", reason="time budget"))
            continue
        try:
            rows.append(time_sequence(kind, uses, dtype, model, impls, device, timer, probe, cold))
        except Exception as err:  # a sequence that cannot run costs its row, the others go on
            rows.append(failed(kind, uses, one_line(err)))
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows
