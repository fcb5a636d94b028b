"""The rows of `phasebench interference`'s spatial form (a mode's pooled windows against the alone mode's) and what
every row carries: the ITL's mean and tail, and the whole model's per-user figures (measured or scaled, and which)."""

from __future__ import annotations

import math
import statistics

import numpy as np

from ...instruments.roofline import device_name
from ...instruments.timing import Timing
from ...spec.interference_schema import COVERED_MIN
from ...spec.interval import median_interval
from .corunner import cpu_list

# a co-located window grows until a whole prefill iteration lies in it: up to this many windows or prefills alone
MAX_STRETCH_WINDOW = 10


def median_or_nan(values) -> float:
    return statistics.median(values) if values else float("nan")


def base_row(cfg, batch: int) -> dict:
    """What every row of a run at this batch names: the device, the model as timed, the batch and its context."""
    return {"device": str(cfg.device), "device_name": device_name(cfg.device), "device_kind": cfg.device.type,
            "model": cfg.model.name, "layers": cfg.layers, "dtype": cfg.dtype, "batch": batch, "context": cfg.context}


# The fewest samples a percentile is read from: 1 / (1 - q), so that one sample at least lies past it (p99 from 100,
# p90 from 10); below, the column is blank and the tail is the max of N.
def supported(pct: float, count: int) -> bool:
    return count >= round(1 / (1 - pct / 100))


def itl_columns(samples_ms) -> dict:
    """The inter-token latency's mean, p50, p90, p99 and max over samples (ms): a time-sliced or bimodal latency
    hides its stalls from the median. A percentile the count does not support is blank; itl_tail_ms is the p99
    where supported, else the max, and itl_tail says which ("p99" or "max of N")."""
    values = np.asarray(list(samples_ms), dtype=float)
    if not len(values):
        return {"itl_mean_ms": math.nan, "itl_p50_ms": math.nan, "itl_p90_ms": math.nan, "itl_p99_ms": math.nan,
                "itl_max_ms": math.nan, "itl_tail_ms": math.nan, "itl_tail": ""}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    n = len(values)
    p90, p99 = (float(v) if supported(q, n) else math.nan for q, v in ((90, p90), (99, p99)))
    tail = ("p99", p99) if supported(99, n) else (f"max of {n}", float(values.max()))
    return {"itl_mean_ms": float(values.mean()), "itl_p50_ms": float(p50), "itl_p90_ms": p90, "itl_p99_ms": p99,
            "itl_max_ms": float(values.max()), "itl_tail_ms": tail[1], "itl_tail": tail[0]}


def whole_model_columns(itl_mean_ms: float, head_ms: float, layers: int, model_layers: int,
                        alone_mean_ms: float | None = None) -> dict:
    """Each user's tokens/s of the whole model: from the mean ITL where all its layers were timed, otherwise the
    timed layers' share (the mean less the head) scaled to the model's layers with the head counted once. The head
    is timed alone: beside a co-runner it is taken as slowed like the whole step (itl_mean / alone_mean), so that
    its own slowdown is not multiplied by the layer count."""
    if not math.isfinite(head_ms):
        head_ms = 0.0 if layers == model_layers else math.nan
    if alone_mean_ms and math.isfinite(alone_mean_ms) and alone_mean_ms > 0:
        head_ms = head_ms * itl_mean_ms / alone_mean_ms
    whole = itl_mean_ms if layers == model_layers else head_ms + (itl_mean_ms - head_ms) * model_layers / layers
    label = f"all {model_layers} layers" if layers == model_layers else f"scaled from {layers} of {model_layers} layers"
    return {"model_layers": model_layers, "head_ms": head_ms, "model_itl_ms": whole,
            "tokens_per_s_per_user": 1e3 / whole if whole > 0 else math.nan, "whole_model": label}


def progress_line(round_: int, rounds: int, batch: int, prompt: int, modes: list, windows) -> str:
    """This round's decode medians of one (batch, prompt), each against the alone window of the same round."""
    found = {m.key: windows[(batch, prompt, m.key)] for m in modes}
    latest = {key: runs[-1] for key, runs in found.items() if len(runs) > round_}
    alone = median_or_nan(latest[("alone", "alone")].samples_ms) if ("alone", "alone") in latest else float("nan")
    parts = []
    for mode in modes:
        if mode.key in latest:
            ms = median_or_nan(latest[mode.key].samples_ms)
            name = "alone" if mode.name == "alone" else f"{mode.name}/{mode.mechanism}"
            stretch = "" if mode.name == "alone" else f" x{ms / alone:.2f}"
            parts.append(f"{name} {ms:.3g} ms{stretch}{' NOISY' if latest[mode.key].noisy else ''}")
    return f"round {round_ + 1}/{rounds} prompt {prompt} batch {batch}: " + ", ".join(parts)


def mode_rows(cfg, modes: list, skipped: dict, batch: int, prompt: int, windows, alone_prefill, errors,
              head_ms: float = math.nan) -> list[dict]:
    """The rows of one (batch, prompt): each mode's pooled windows against the alone mode's; head_ms: the head
    timed alone at this batch (for the whole model's figures)."""
    base = {**base_row(cfg, batch), "prompt": prompt, "rounds": cfg.rounds, "window_s": cfg.window_s}
    alone = [s for w in windows.get((batch, prompt, ("alone", "alone")), []) for s in w.samples_ms]
    alone_t = Timing(tuple(alone), "") if alone else None
    first_runner = next((m.runner for m in modes if m.runner), None)
    rows = []
    for mode in modes:
        found = windows.get((batch, prompt, mode.key), [])
        runner = mode.runner or first_runner
        host = cfg.device.type != "cuda"
        row = {**base, "mode": mode.name, "mechanism": mode.mechanism,
               "decode_threads": mode.decode.threads if host else None,
               "prefill_threads": mode.prefill.threads if host and mode.runner else None,
               "decode_cpus": cpu_list(mode.decode.cpus) if host else "",
               "prefill_cpus": cpu_list(mode.prefill.cpus) if host and mode.runner else ""}
        why = errors.get((batch, prompt, mode.key)) or (errors.get((prompt, runner)) if runner else None)
        if not found or alone_t is None:
            rows.append({**row, "status": "failed", "reason": why or "the alone mode was not measured"})
            continue
        t = Timing(tuple(s for w in found for s in w.samples_ms), "")
        prefill_alone = median_or_nan(alone_prefill.get((prompt, runner), []))
        prefill = median_or_nan([p for w in found for p in w.prefill_ms]) if mode.runner else prefill_alone
        noisy = [w for w in found if w.noisy]
        others = [w.others_cores for w in found if w.others_cores is not None]
        reasons = []
        if len(found) < cfg.rounds:  # a round failed or was interrupted: the row holds those that ran
            reasons = [f"{len(found)} of {cfg.rounds} rounds", *([why] if why else [])]
        if mode.runner and not any(w.prefill_ms for w in found):
            reasons.append(f"no whole prefill iteration inside {MAX_STRETCH_WINDOW} windows or prefills alone")
        covered = min((w.covered for w in found if w.covered is not None), default=math.nan)  # the worst window
        if covered < COVERED_MIN:
            reasons.append(f"the prefill ran through only {covered:.0%} of a timed window: the stretch understates it")
        itl, only = itl_columns(t.samples_ms), itl_columns(alone_t.samples_ms)
        rows.append({**row, **itl, "decode_only_ms": only["itl_mean_ms"], "decode_only_p99_ms": only["itl_p99_ms"],
                     **whole_model_columns(itl["itl_mean_ms"], head_ms, cfg.layers, cfg.model.layers,
                                           only["itl_mean_ms"]),
                     "decode_ms": t.median_ms, "decode_p10_ms": t.percentile_ms(10),
                     "decode_p90_ms": t.percentile_ms(90) if supported(90, t.count) else math.nan,
                     "samples": t.count,
                     "stretch": itl["itl_mean_ms"] / only["itl_mean_ms"],  # the mean: stalls count, not hidden
                     "p90_stretch": t.percentile_ms(90) / alone_t.percentile_ms(90)
                     if supported(90, t.count) and supported(90, alone_t.count) else math.nan,
                     "prefill_alone_ms": prefill_alone,
                     "prefill_ms": prefill, "prefill_slowdown": prefill / prefill_alone,
                     "prefill_samples": sum(len(w.prefill_ms) for w in found) if mode.runner else None,
                     "covered": covered if mode.runner else None,
                     "others_cores": max(others) if others else None, "noisy": bool(noisy),
                     "noise_reason": noisy[0].reason if noisy else "", "status": "ok", "reason": "; ".join(reasons)})
    for (name, mechanism), why in skipped.items():
        rows.append({**base, "mode": name, "mechanism": mechanism, "status": "skipped", "reason": why})
    return rows


def _range_pct(values) -> float:
    values = [v for v in values if math.isfinite(v)]
    return 100 * (max(values) / min(values) - 1) if len(values) > 1 and min(values) > 0 else math.nan


def hybrid_columns(arrivals_ms: list[list[float]], shallow_ms: list[list[float]], batch: int, layers: int,
                   shallow_layers: int | None, model_layers: int) -> dict:
    """The figures of one hybrid (batch, prompt, chunk) from each arrival's iterations (ms, in order) through the
    `layers` timed and, where fewer than the model's were timed, through `shallow_layers` too (the same arrivals).
    Timed layers: the ITL over every iteration (itl_columns), TTFT as the median of the arrivals with its 95%
    interval, the slowest position's median over arrivals with its interval (itl_position_max_ms: the prompt's
    position, apart from the arrivals' spread), position_range_pct (slowest against fastest position's median) and
    arrival_range_pct (slowest against fastest arrival's TTFT). Whole model (model_*): each iteration position's
    per-layer cost from the two depths (the median over arrivals of (deep - shallow) / (layers - shallow_layers)),
    so whatever runs once per iteration (the head, concatenations, the positions' gather) cancels and is added once
    (fixed_ms: its mean over positions), times the layers not timed added to every sample of that position: every
    latency column scaled the same way; model_ttft_ms is the median of each arrival's own whole-model TTFT (its timed
    sum plus its own scaled deep - shallow), with the 95% interval of that median."""
    done = [a for a in arrivals_ms if a]
    count = len(done[0]) if done else 0
    deep = np.array([a for a in done if len(a) == count], dtype=float).reshape(-1, count)
    ttft = deep.sum(axis=1)
    found = median_interval(ttft)
    positions = [median_interval(deep[:, i]) for i in range(count)]
    slowest = max(positions, key=lambda p: p.median) if positions else median_interval([])
    out = {**itl_columns(deep.ravel()), "arrivals": len(ttft), "iterations": count, "ttft_ms": found.median,
           "ttft_low_ms": found.low, "ttft_high_ms": found.high,
           "ttft_max_ms": float(ttft.max()) if len(ttft) else math.nan,
           "itl_position_max_ms": slowest.median, "itl_position_max_low_ms": slowest.low,
           "itl_position_max_high_ms": slowest.high, "position_range_pct": _range_pct([p.median for p in positions]),
           "arrival_range_pct": _range_pct(list(ttft)), "model_layers": model_layers,
           "decode_tokens_per_s": batch * count * 1e3 / found.median if found.median > 0 else math.nan}
    if layers == model_layers:
        increase, fixed = np.zeros(count), math.nan
        model_ttft, low, high = found.median, found.low, found.high
        label = f"all {model_layers} layers"
    else:
        # the same arrival at both depths (an arrival that did not finish at either is left out of the pairs)
        paired = [(a, b) for a, b in zip(arrivals_ms, shallow_ms, strict=False) if len(a) == count == len(b)]
        if shallow_layers is None or not paired or not count:
            return {**out, "whole_model": f"not scaled: {layers} of {model_layers} layers timed at one depth only"}
        at_deep = np.array([a for a, _ in paired], dtype=float)
        at_shallow = np.array([b for _, b in paired], dtype=float)
        apart = layers - shallow_layers
        per_layer = np.median(at_deep - at_shallow, axis=0) / apart
        increase = (model_layers - layers) * per_layer
        fixed = float(np.mean(np.median(at_deep, axis=0) - layers * per_layer))
        # each arrival's own whole-model TTFT, its median and interval: its timed sum and its scaled
        # (deep - shallow) move together, so their noise is neither independent nor added in quadrature
        arrival = median_interval(at_deep.sum(axis=1) + (model_layers - layers) / apart
                                  * (at_deep - at_shallow).sum(axis=1))
        model_ttft, low, high = arrival.median, arrival.low, arrival.high
        label = f"from {shallow_layers} and {layers} of {model_layers} layers, the per-iteration fixed cost once"
    whole = deep + increase
    itl = itl_columns(whole.ravel())
    return {**out, "model_itl_ms": itl["itl_mean_ms"], "model_itl_tail_ms": itl["itl_tail_ms"],
            "model_ttft_ms": model_ttft, "model_ttft_low_ms": low, "model_ttft_high_ms": high, "fixed_ms": fixed,
            "model_decode_tokens_per_s": batch * count * 1e3 / model_ttft if model_ttft > 0 else math.nan,
            "tokens_per_s_per_user": 1e3 / itl["itl_mean_ms"] if itl["itl_mean_ms"] > 0 else math.nan,
            "whole_model": label}


def zero_layer_columns(arrivals_ms: list[list[float]], zero_ms: list[list[float]]) -> dict:
    """What an iteration costs beyond its layers, from the same arrivals timed through no layer (the head, the
    positions' gather, the inputs' concatenation, the tokens read back): the median over arrivals of their sum
    (zero_layer_ttft_ms), and the median at the position that is slowest through every layer
    (zero_layer_slowest_ms). NaN where no arrival was timed at both depths."""
    count = len(next((a for a in arrivals_ms if a), []))
    zero = np.array([z for z in zero_ms if len(z) == count], dtype=float).reshape(-1, count)
    deep = np.array([a for a in arrivals_ms if len(a) == count], dtype=float).reshape(-1, count)
    if not count or not len(zero) or not len(deep):
        return {"zero_layer_ttft_ms": math.nan, "zero_layer_slowest_ms": math.nan}
    slowest = int(np.argmax(np.median(deep, axis=0)))
    return {"zero_layer_ttft_ms": float(np.median(zero.sum(axis=1))),
            "zero_layer_slowest_ms": float(np.median(zero[:, slowest]))}
