"""The hybrid form of `phasebench interference`: one prompt's arrival processed iteration by iteration (whole, or in
chunks) with the decode users stepping in every iteration, against the decode-only iteration; one row per chunk."""

from __future__ import annotations

import contextlib
import gc
import math
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field

import torch

from ...spec.interference_schema import WHOLE
from ...sweep.measure import one_line
from ..hybrid_step import HybridStep, chunk_plan, hybrid_step
from ..reference_decoder import ReferenceDecoder
from .rows import hybrid_columns, itl_columns, zero_layer_columns

MIN_DECODE_ONLY = 8  # decode-only iterations per round, at least (as many as the prompt's iterations otherwise)


def parse_chunk(value: str | int) -> int | str:
    """A --chunk value: a positive int of tokens, or 'whole' (the prompt in one iteration)."""
    if isinstance(value, str) and value.strip().lower() == WHOLE:
        return WHOLE
    try:
        chunk = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"chunk: must be a positive int or '{WHOLE}', got {value!r}") from None
    if chunk < 1:
        raise ValueError(f"chunk: must be a positive int or '{WHOLE}', got {value!r}")
    return chunk


def check_chunks(chunks, prompts) -> None:
    """One-line ValueErrors: no chunk, a bad one, or one larger than every prompt (a chunk larger than some prompts
    only gets their rows skipped)."""
    if not chunks:
        raise ValueError("chunk: needs at least one chunk size or 'whole'")
    for chunk in chunks:
        if parse_chunk(chunk) != chunk:
            raise ValueError(f"chunk: must be a positive int or '{WHOLE}', got {chunk!r}")
        if chunk != WHOLE and chunk > max(prompts):
            raise ValueError(f"chunk: {chunk} tokens is more than the largest prompt's {max(prompts)}")


def chunk_label(chunk: int | str) -> str:
    return WHOLE if chunk == WHOLE else str(chunk)


def arrival_steps(batch: int, context: int, prompt: int, chunk: int | str) -> list[HybridStep]:
    """The iterations from the prompt's arrival to its first token, the users at `context` in every one."""
    plan = chunk_plan(prompt, None if chunk == WHOLE else chunk)
    return [HybridStep(batch, context, start, tokens, last=i == len(plan) - 1) for i, (start, tokens) in
            enumerate(plan)]


def shallow_depth(layers: int, model_layers: int) -> int | None:
    """The second depth each arrival is timed at where fewer than the model's layers are (half of them), so that a
    layer's cost is read from the difference and the per-iteration fixed cost added once; None where all the
    model's layers are timed or only one is."""
    return layers // 2 if 2 <= layers < model_layers else None


def time_iterations(decoder: ReferenceDecoder, steps: list[HybridStep], x_decode: torch.Tensor | None,
                    x_prompt: torch.Tensor | None, depth: int | None = None) -> list[float]:
    """Each iteration's duration in ms, in order, the tokens read back after each as a serving loop does: CUDA events
    around each on the current stream, perf_counter_ns on the host (the garbage collector held off); through the
    first `depth` layers (default all)."""
    cuda = decoder.device.type == "cuda"
    out = []
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        for step in steps:
            xp = x_prompt[:, step.start:step.start + step.tokens] if step.tokens else None
            xd = x_decode if step.batch else None
            if cuda:
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                ids = hybrid_step(decoder, step, xd, xp, depth=depth)
                end.record()
                ids.cpu()
                out.append(begin.elapsed_time(end))
            else:
                t0 = time.perf_counter_ns()
                hybrid_step(decoder, step, xd, xp, depth=depth).cpu()
                out.append((time.perf_counter_ns() - t0) / 1e6)
    finally:
        if gc_was_on:
            gc.enable()
    return out


@dataclass
class Scenario:
    """What one (batch, prompt, chunk) collected over the rounds."""

    itl_ms: list[float] = field(default_factory=list)  # every iteration of every arrival
    decode_only_ms: list[float] = field(default_factory=list)
    ttft_ms: list[float] = field(default_factory=list)  # one per arrival
    arrivals_ms: list[list[float]] = field(default_factory=list)  # each arrival's iterations, in order
    shallow_ms: list[list[float]] = field(default_factory=list)  # the same arrivals through the shallow depth
    zero_ms: list[list[float]] = field(default_factory=list)  # the same arrivals through no layer
    iterations: int = 0
    error: str = ""
    noisy: int = 0  # arrivals whose window the contention probe judged noisy
    noise_reason: str = ""
    others_cores: list[float] = field(default_factory=list)


def measure_hybrid(cfg, decoder: ReferenceDecoder, say, interrupted: list, watch=None) -> list[dict]:
    """For each batch and prompt, `cfg.arrivals` rounds over the chunk sizes (their order turned each round): the
    decode-only iterations, then one prompt's arrival to its first token (the prompt in cache row `batch`), and
    where fewer than the model's layers are timed the same arrival through the shallow depth (shallow_depth), and
    through no layer (what an iteration costs beyond its layers: zero_layer_columns); the
    prompt's prefill alone once per round. `watch()`: the contention probe's context around each arrival (its
    verdict has .noisy, .reason, .stats). Returns one row per (batch, prompt, chunk); an interrupt (appended to
    `interrupted`) ends the rounds and the rows keep what was measured."""
    gen = torch.Generator(device=decoder.device).manual_seed(cfg.seed + 7)
    hidden, dtype = decoder.config.hidden, decoder.dtype
    found: dict[tuple, Scenario] = defaultdict(Scenario)
    alone: dict[int, list[float]] = defaultdict(list)
    prompts = {p: torch.randn(1, p, hidden, generator=gen, device=decoder.device).to(dtype) for p in cfg.prompts}
    shallow = shallow_depth(cfg.layers, cfg.model.layers)
    try:
        for round_ in range(cfg.arrivals):
            for prompt in cfg.prompts:
                chunks = [c for c in cfg.chunks if c == WHOLE or c <= prompt]
                turn = round_ % len(chunks)
                try:
                    alone[prompt] += time_iterations(decoder, [HybridStep(0, 0, 0, prompt, last=True)], None,
                                                     prompts[prompt])
                except RuntimeError as err:
                    say(f"hybrid: the prefill of {prompt} alone failed: {one_line(err)}")
                for batch in cfg.batches:
                    x_decode = torch.randn(batch, 1, hidden, generator=gen, device=decoder.device).to(dtype)
                    for chunk in chunks[turn:] + chunks[:turn]:
                        one = found[(batch, prompt, chunk)]
                        steps = arrival_steps(batch, cfg.context, prompt, chunk)
                        try:
                            if round_ == 0:  # every shape's first call (allocations, kernel choice) untimed
                                time_iterations(decoder, steps, x_decode, prompts[prompt])
                                if shallow:
                                    time_iterations(decoder, steps, x_decode, prompts[prompt], shallow)
                                time_iterations(decoder, steps, x_decode, prompts[prompt], 0)
                            with watch() if watch else contextlib.nullcontext() as seen:
                                one.decode_only_ms += time_iterations(
                                    decoder, [HybridStep(batch, cfg.context)] * max(MIN_DECODE_ONLY, len(steps)),
                                    x_decode, None)
                                spans = time_iterations(decoder, steps, x_decode, prompts[prompt])
                                cut = (time_iterations(decoder, steps, x_decode, prompts[prompt], shallow)
                                       if shallow else [])
                                zero = time_iterations(decoder, steps, x_decode, prompts[prompt], 0)
                            if seen is not None:
                                one.noisy += bool(seen.noisy)
                                one.noise_reason = one.noise_reason or seen.reason
                                if seen.stats.get("other_cores") is not None:
                                    one.others_cores.append(seen.stats["other_cores"])
                        except RuntimeError as err:  # out of memory: recorded, the sweep goes on
                            one.error = one.error or one_line(err)
                            continue
                        one.itl_ms += spans
                        one.ttft_ms.append(sum(spans))
                        one.arrivals_ms.append(spans)
                        if cut:
                            one.shallow_ms.append(cut)
                        one.zero_ms.append(zero)
                        one.iterations = len(steps)
                    say(progress_line(round_, cfg, batch, prompt, chunks, found))
    except KeyboardInterrupt:
        interrupted.append(True)
        say("interrupted: the hybrid rows hold the arrivals measured so far")
    return hybrid_rows(cfg, found, alone)


def progress_line(round_: int, cfg, batch: int, prompt: int, chunks, found) -> str:
    parts = []
    for chunk in chunks:
        one = found.get((batch, prompt, chunk))
        if one is None or not one.ttft_ms:
            continue
        last = one.itl_ms[-one.iterations:]
        parts.append(f"{chunk_label(chunk)}: worst ITL {max(last):.3g} ms, TTFT {one.ttft_ms[-1]:.4g} ms")
    decode = next((found[(batch, prompt, c)].decode_only_ms for c in chunks if found[(batch, prompt, c)].ttft_ms),
                  [])
    head = f"decode-only {statistics.mean(decode):.3g} ms; " if decode else ""
    return f"hybrid round {round_ + 1}/{cfg.arrivals} prompt {prompt} batch {batch}: " + head + ", ".join(parts)


def hybrid_rows(cfg, found: dict, alone: dict) -> list[dict]:
    """The rows of the hybrid form (rows.hybrid_columns): the ITL's mean and tail over the prompt's iterations
    against the decode-only iteration, TTFT with its interval, the decode users' tokens/s meanwhile and the cost of
    chunking (against `whole`), at the timed layers; the whole model's figures (model_*) beside them."""
    rows, shallow = [], shallow_depth(cfg.layers, cfg.model.layers)
    for batch in cfg.batches:
        for prompt in cfg.prompts:
            ttft, whole_model = {}, {}
            for chunk in cfg.chunks:
                row = {"mode": "hybrid", "mechanism": "whole prompt" if chunk == WHOLE else "chunked",
                       "batch": batch, "prompt": prompt, "chunk": chunk_label(chunk),
                       "chunk_tokens": prompt if chunk == WHOLE else chunk, "rounds": cfg.arrivals}
                one = found.get((batch, prompt, chunk))
                if chunk != WHOLE and chunk > prompt:
                    rows.append({**row, "status": "skipped",
                                 "reason": f"chunk {chunk} is more than the prompt's {prompt} tokens"})
                    continue
                if one is None or not one.ttft_ms:
                    rows.append({**row, "status": "failed", "reason": (one.error if one else "") or "not measured"})
                    continue
                only = itl_columns(one.decode_only_ms)
                figures = hybrid_columns(one.arrivals_ms, one.shallow_ms, batch, cfg.layers, shallow,
                                         cfg.model.layers)
                figures.update(zero_layer_columns(one.arrivals_ms, one.zero_ms))
                ttft[chunk] = figures["ttft_ms"]
                whole_model[chunk] = figures.get("model_ttft_ms", math.nan)
                reasons = [f"{len(one.ttft_ms)} of {cfg.arrivals} arrivals"] if len(one.ttft_ms) < cfg.arrivals else []
                rows.append({**row, **figures, "samples": len(one.itl_ms),
                             "decode_only_ms": only["itl_mean_ms"], "decode_only_p99_ms": only["itl_p99_ms"],
                             "decode_ms": figures["itl_p50_ms"],
                             "stretch": figures["itl_mean_ms"] / only["itl_mean_ms"],
                             "p90_stretch": figures["itl_p90_ms"] / only["itl_p90_ms"],
                             "prefill_alone_ms": statistics.median(alone[prompt]) if alone.get(prompt) else None,
                             "prefill_ms": ttft[chunk],
                             "noisy": one.noisy > 0, "noise_reason": one.noise_reason,
                             "others_cores": max(one.others_cores) if one.others_cores else None,
                             "status": "ok", "reason": "; ".join(reasons + ([one.error] if one.error else []))})
            for row in rows[-len(cfg.chunks):]:
                if row["status"] == "ok" and WHOLE in ttft:
                    row["chunk_cost"] = row["ttft_ms"] / ttft[WHOLE]
                    row["model_chunk_cost"] = row.get("model_ttft_ms", math.nan) / whole_model.get(WHOLE, math.nan)
                if row["status"] == "ok" and row.get("prefill_alone_ms"):
                    row["prefill_slowdown"] = row["ttft_ms"] / row["prefill_alone_ms"]
    return rows
