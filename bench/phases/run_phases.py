"""`phasebench phases`: measure what a decoder's steps run, compose TTFT/TPOT/tokens/s, check a real forward pass."""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from ...analysis.phases import check as phase_check
from ...analysis.phases import hybrid_check, remedies
from ...analysis.phases import model as pm
from ...analysis.phases import speculative as sp
from ..instruments.roofline import device_name
from ..instruments.timing import CI_TARGETS, TimerConfig
from ..spec import steps as step_defs
from ..spec.models import DecoderConfig
from ..spec.store.files import write_file, write_table
from ..spec.store.folder_lock import holding
from ..sweep.runner import CUDA_TIMER, RunConfig, run
from ..sweep.worker import IN_PROCESS, Isolation
from . import reference_check as check
from . import speculative_loop
from .op_cases import case_of

# The host sizes keep `phasebench phases` to minutes on 2 cores (2 for a 1B model, 8 for llama-3-8b); a GPU takes
# the real ones.
HOST = dict(prompts=(32, 128), batches=(1, 2, 4, 8, 16), context=128, chunks=(32, 64), chunk_batch=4,
            reference_layers=2, reference_batches=(1, 8))
# per-op sampling on the host: one call's time varies by about 15% here, so every op gets a warm-up call and at least
# 5 samples (with 3, the median of a 25 ms GEMV read 32 ms in one run and threw a decode step's composition 15% off);
# 6, so that each op has a 95% interval of its median, and fewer calls where that interval is narrow early
HOST_TIMER = TimerConfig(warmup_s=0.05, budget_s=0.25, min_samples=6, max_samples=200, flush_l2=False, cold=True,
                         target=CI_TARGETS["cpu"], min_time_s=0.05)
GPU = dict(prompts=(512, 2048, 8192), batches=(1, 4, 16, 64, 128, 256), context=4096, chunks=(256, 512, 1024, 2048),
           chunk_batch=32, reference_layers=4, reference_batches=(1, 16))


def ops_timer(device: torch.device, sample_time: float | None = None, warm: bool = False,
              ci_target: float | None = None) -> TimerConfig:
    """How each op of the composition is timed: the runner's CUDA timer, or short host sampling with the weights
    and the KV cache cold (warm caches with `warm`); `sample_time` replaces the time limit of the samples per op,
    `ci_target` the relative half-width of the median's interval that stops them."""
    timer = CUDA_TIMER if device.type == "cuda" else HOST_TIMER
    if warm:
        timer = dataclasses.replace(timer, cold=False)
    if sample_time is not None:
        timer = dataclasses.replace(timer, budget_s=sample_time, min_time_s=min(timer.min_time_s, sample_time))
    return timer if ci_target is None else dataclasses.replace(timer, target=ci_target)


@dataclass(frozen=True)
class SpeculateConfig:
    """Speculative decoding to compose (a draft's decode steps and the target's verify passes) and the real loop
    that checks it: `iterations` timed per (batch, γ, α) in each of `rounds` + 1 brackets around the ops' rounds."""

    draft: DecoderConfig
    gammas: tuple[int, ...] = (1, 2, 4, 8)
    alphas: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8, 0.9)
    iterations: int = 8
    rounds: int = 2


# the loop's iterations per bracket: a host keeps them few (a 2-layer TinyLlama verify pass takes ~30 ms there)
LOOP_ITERATIONS = {"cpu": 8, "cuda": 32}


@dataclass
class PhasesConfig:
    """A model and the scenarios to compose for it on one device."""

    model: DecoderConfig
    device: torch.device
    out_dir: Path
    dtype: str
    prompts: tuple[int, ...]
    batches: tuple[int, ...]
    context: int
    chunks: tuple[int, ...]
    chunk_batch: int
    chunk_prompt: int
    reference_layers: int
    reference_batches: tuple[int, ...]  # decode batches the real forward pass checks (prefill: chunk_prompt)
    references: tuple[str, ...] = ("phasebench",)  # reference_check.REFERENCES
    impls: dict[str, str] = field(default_factory=lambda: dict(pm.DEFAULT_IMPLS))
    timer: TimerConfig | None = None
    on_row: object = None
    isolation: Isolation = IN_PROCESS  # where the ops are measured (the reference decoder runs here)
    time_budget_s: float | None = None  # wall seconds for the whole verb, from `started` (time.monotonic())
    retry_noisy: int = 0  # rounds that measure the noisy ops again (the composition takes quiet rows only)
    rounds: int = 1  # rounds of the ops, each in a fresh worker: the interval a repeat lands in (bench.sweep.rounds)
    started: float | None = None
    interference: pd.DataFrame | None = None  # `phasebench interference` rows: measured co-located stretches
    page_size: int = 0  # decode and chunk attention read the KV cache in pages of this many tokens (0: contiguous)
    reference_rounds: int = check.ROUNDS  # rounds of the check's ops, interleaved with the reference's brackets
    weights: str = ""  # the layers' projections packed by this scheme (qlinear rows; "": unquantized)
    experts: str = ""  # a mixture's routed experts packed by this scheme (moe rows of that scheme; "": unquantized)
    speculate: SpeculateConfig | None = None  # compose speculative decoding (at the reference batches) and check it
    kv_dtype: str = ""  # the decode calls read the KV cache (MLA: the latent) stored as this ("": the model's dtype)

    @classmethod
    def defaults(cls, model: DecoderConfig, device: torch.device, out_dir: Path, **given) -> PhasesConfig:
        base = GPU if device.type == "cuda" else HOST
        # past a mixture's first dense layers, so that the layers 2L adds (the per-layer check) are mixture layers
        layers = min(max(base["reference_layers"], model.dense_layers), model.layers)
        sizes = {**base, "reference_layers": layers,
                 **{k: v for k, v in given.items() if v is not None}}
        sizes.setdefault("chunk_prompt", max(sizes["prompts"]))
        sizes.setdefault("dtype", "bfloat16" if device.type == "cuda" else "float32")
        return cls(model, device, Path(out_dir), **sizes)


def scenario_steps(cfg: PhasesConfig) -> list[list[step_defs.OpUse]]:
    """Every step the composition will sum, so that each op it needs is measured once."""
    m, out = cfg.model, []
    out += [step_defs.prefill_step(m, p) for p in (*cfg.prompts, cfg.chunk_prompt)]
    out += [step_defs.decode_step(m, b, c, cfg.page_size)
            for b in sorted({*cfg.batches, cfg.chunk_batch, *cfg.reference_batches})
            for c in sorted({cfg.context, *cfg.prompts})]
    for chunk in cfg.chunks:
        for batch in (cfg.chunk_batch, 0):
            out += step_defs.chunked_prefill_steps(m, cfg.chunk_prompt, chunk, batch, cfg.context, cfg.page_size)
    if cfg.speculate:
        out += [step_defs.verify_step(m, b, cfg.context, g, cfg.page_size) for b in cfg.reference_batches
                for g in cfg.speculate.gammas]
    out += hybrid_check.hybrid_steps(m, measured_hybrid(cfg), cfg.page_size)
    steps = [step_defs.with_kv_dtype(step_defs.with_weights(step, cfg.weights, cfg.experts), cfg.kv_dtype)
             for step in out]
    if cfg.weights or cfg.experts:  # the float decode steps too, for TPOT's gain over float weights in the same run
        steps += [step_defs.decode_step(m, b, cfg.context, cfg.page_size) for b in cfg.batches]
    if cfg.kv_dtype:  # the decode steps over a cache in the dtype too, for TPOT's gain in the same run
        steps += [step_defs.with_weights(step_defs.decode_step(m, b, cfg.context, cfg.page_size), cfg.weights,
                                         cfg.experts) for b in cfg.batches]
    return steps


def measured_hybrid(cfg: PhasesConfig, quiet: bool = True) -> pd.DataFrame:
    """The hybrid iterations `phasebench interference` timed for this model, dtype and device, through any number
    of its layers (each checked against the model cut to them; unquantized and contiguous: the interference
    decoder's weights and cache are)."""
    if cfg.weights or cfg.experts or cfg.page_size or cfg.kv_dtype:  # the interference decoder: a dtype cache
        return pd.DataFrame()
    return hybrid_check.hybrid_rows(cfg.interference, model=cfg.model.name, dtype=cfg.dtype,
                                    device=device_name(cfg.device), layers=cfg.model.layers, quiet=quiet)


def draft_steps(cfg: PhasesConfig) -> list[list[step_defs.OpUse]]:
    """The draft's decode steps that speculation composes (none without --speculate)."""
    if not cfg.speculate:
        return []
    return [step_defs.decode_step(cfg.speculate.draft, b, cfg.context, cfg.page_size) for b in cfg.reference_batches]


def measured_cases(cfg: PhasesConfig, reuse: pd.DataFrame | None) -> list:
    """The cases of every composed step, the target's and the draft's under their own model names, less those that
    `reuse` already measured."""
    cases = []
    for model, steps in ((cfg.model, scenario_steps(cfg)), (cfg.speculate and cfg.speculate.draft, draft_steps(cfg))):
        uses = step_defs.distinct_uses(steps)
        if reuse is not None and uses:  # measure only what the given results lack
            have = pm.Measured(reuse, model=model.name, dtype=cfg.dtype, impls=cfg.impls)
            uses = [u for u in uses if have.latency_ms(u) is None]
        cases += [case_of(u, cfg.dtype, model.name) for u in uses]
    return cases


def reference_reserve_s(budget_s: float) -> float:
    """Of a time budget, what the ops leave for the reference check, the composition and the tables."""
    return max(3.0, 0.2 * budget_s)


TABLES_S = 1.0  # of the reserve, what the check leaves for the composition and the tables
# what a composed figure's interval is, by whether the ops ran in rounds (phases.json "intervals")
INTERVALS = {True: "where a repeat of the command lands (the spread of the figure's per-round totals)",
             False: "the rows' within-run intervals in quadrature (one round: no repeat interval)"}


def compose(df: pd.DataFrame, cfg: PhasesConfig, iterations: dict | None = None) -> dict[str, pd.DataFrame]:
    """The phase tables from measured rows and the per-iteration costs the check measured (analysis does the
    arithmetic; no measurement here)."""
    measured = pm.Measured(df, model=cfg.model.name, dtype=cfg.dtype, impls=cfg.impls, weights=cfg.weights,
                           iterations=iterations, experts=cfg.experts, kv_dtype=cfg.kv_dtype)
    page = cfg.page_size
    decode = pm.batch_sweep(measured, cfg.model, cfg.batches, cfg.context, page_size=page)
    hybrid = hybrid_check.hybrid_check(measured, cfg.model, measured_hybrid(cfg), page)
    if cfg.weights or cfg.experts:
        # the same per-iteration cost on both sides: the zero-layer pass a step adds has no weights of its own
        plain = pm.Measured(df, model=cfg.model.name, dtype=cfg.dtype, impls=cfg.impls, iterations=iterations)
        decode = pm.beside_unquantized(decode, pm.batch_sweep(plain, cfg.model, cfg.batches, cfg.context,
                                                              page_size=page))
    if cfg.kv_dtype:  # beside the same steps over a cache in the dtype: dtype_kv_tpot_ms and kv_dtype_speedup
        plain = pm.Measured(df, model=cfg.model.name, dtype=cfg.dtype, impls=cfg.impls, weights=cfg.weights,
                            experts=cfg.experts, iterations=iterations)
        decode = pm.beside_unquantized(decode, pm.batch_sweep(plain, cfg.model, cfg.batches, cfg.context,
                                                              page_size=page), base="dtype_kv", gain="kv_dtype")
    decode = decode.assign(kv_dtype=cfg.kv_dtype or cfg.dtype)
    return {
        "prefill": pm.prefill_table(measured, cfg.model, cfg.prompts),
        "decode": decode,
        # the published chunked table with the verdict of the measured hybrid rows of its own shapes
        "chunked": hybrid_check.chunked_verdicts(
            pm.chunk_table(measured, cfg.model, cfg.chunk_prompt, cfg.chunks, cfg.chunk_batch, cfg.context, page),
            hybrid),
        "colocated": remedies.colocated_table(measured, cfg.model, cfg.chunk_prompt, cfg.chunk_batch, cfg.context,
                                        cfg.interference, page),
        # the composed hybrid iterations against the measured ones (empty without --interference hybrid rows)
        "hybrid_check": hybrid,
        "interactive": pm.interactive_limits(measured, cfg.model, cfg.prompts, cfg.batches, page_size=page),
        # where a decode step's time goes, at the largest batch the real forward pass checks (the figure sets
        # the two side by side)
        "decode_parts": pm.with_iteration(measured, pm.tpot(measured, cfg.model, max(cfg.reference_batches),
                                                             cfg.context, page),
                                          ("decode", max(cfg.reference_batches), cfg.context)).items.drop(
            columns="rounds").assign(
            batch=max(cfg.reference_batches), context=cfg.context, layers=cfg.model.layers),
    }


def reference_plan(cfg: PhasesConfig) -> phase_check.ReferencePlan:
    """The real forward passes keep a contiguous cache: with page_size, the gap includes what the pages cost."""
    return phase_check.ReferencePlan(cfg.model, cfg.reference_layers, str(cfg.device), cfg.dtype, cfg.chunk_prompt,
                                     tuple(cfg.reference_batches), cfg.context, tuple(cfg.references), cfg.page_size,
                                     cfg.weights, cfg.impls.get("qlinear", pm.DEFAULT_IMPLS["qlinear"]),
                                     *(cfg.impls.get(op, pm.DEFAULT_IMPLS[op]) for op in ("moe", "attention", "mla")),
                                     iteration_scenarios=published_scenarios(cfg), experts=cfg.experts)


def published_scenarios(cfg: PhasesConfig) -> tuple[tuple[str, int, int], ...]:
    """(phase, batch, tokens) of the prefill and decode tables' steps, whose per-iteration cost the check measures
    (a zero-layer pass of phasebench's decoder, contiguous and in the activation dtype, as the check's passes)."""
    return (*(("prefill", 1, p) for p in cfg.prompts), *(("decode", b, cfg.context) for b in cfg.batches))


def reference_check(cfg: PhasesConfig, timer: TimerConfig, impls: dict, published: pd.DataFrame) -> dict:
    """The real forward passes timed in brackets around rounds of the ops they compose to (DIR/check), so that a
    machine that drifts moves both sides alike: the reference table and its details (the error of the composition
    published from the `published` rows, and one layer's error per round), the brackets, and the per-iteration cost
    of each published step."""
    plan = reference_plan(cfg)
    cases = [case_of(u, cfg.dtype, cfg.model.name) for u in plan.uses()]
    budget = None if cfg.time_budget_s is None else cfg.time_budget_s - TABLES_S
    brackets, rows = check.run_check(plan, cases, impls, cfg.out_dir / "check", timer=timer, isolation=cfg.isolation,
                                     rounds=cfg.reference_rounds, time_budget_s=budget, started=cfg.started,
                                     on_row=cfg.on_row)
    frame = functools.partial(pm.Measured, model=cfg.model.name, dtype=cfg.dtype, impls=cfg.impls,
                              weights=cfg.weights, experts=cfg.experts)
    per_round = [frame(part, keep_noisy=True) for part in check.rounds_of(rows, cases, impls, cfg.reference_rounds)]
    shown = frame(published)  # the tables' own rows, indexed once for both
    table, details = phase_check.check_table(brackets, plan, published=shown, per_round=per_round)
    return {"reference": table, "reference_details": details, "reference_brackets": check.brackets_table(brackets),
            "iterations": phase_check.iteration_costs(brackets, plan, shown)}


def run_phases(cfg: PhasesConfig, reuse: pd.DataFrame | None = None) -> dict[str, pd.DataFrame]:
    """Measure (or reuse) the ops, check a real forward pass, compose, and write every table under out_dir (held
    against a second writer; each table renamed into place whole)."""
    with holding(cfg.out_dir):
        return _run_phases(cfg, reuse)


def _run_phases(cfg: PhasesConfig, reuse: pd.DataFrame | None) -> dict[str, pd.DataFrame]:
    cases = measured_cases(cfg, reuse)
    impls = {op: [name] for op, name in cfg.impls.items()}
    timer = cfg.timer or ops_timer(cfg.device)
    budget = None if cfg.time_budget_s is None else cfg.time_budget_s - reference_reserve_s(cfg.time_budget_s)
    rows = run(RunConfig(cases, impls, cfg.device, cfg.out_dir / "ops", suite="phases", timer=timer,
                         on_row=cfg.on_row, isolation=cfg.isolation, time_budget_s=budget, started=cfg.started,
                         retry_noisy=cfg.retry_noisy, rounds=cfg.rounds, combine_rounds=cfg.rounds > 1)) \
        if cases else pd.DataFrame()
    df = pd.concat([x for x in (reuse, rows) if x is not None and len(x)], ignore_index=True)
    checked = reference_check(cfg, timer, impls, df)
    iterations = checked.pop("iterations")
    tables = compose(df, cfg, iterations)
    tables.update(checked)
    if cfg.speculate:
        tables.update(speculative_tables(cfg, df, timer, impls))
    for name, table in tables.items():
        write_table(cfg.out_dir / f"{name}.csv", table)
    write_file(cfg.out_dir / "phases.json", json.dumps({
        "model": dataclasses.asdict(cfg.model), "device": str(cfg.device), "dtype": cfg.dtype, "impls": cfg.impls,
        "prompts": cfg.prompts, "batches": cfg.batches, "context": cfg.context, "chunks": cfg.chunks,
        "chunk_batch": cfg.chunk_batch, "chunk_prompt": cfg.chunk_prompt, "page_size": cfg.page_size,
        "kv_dtype": cfg.kv_dtype or cfg.dtype, "kv_dtype_checked": not cfg.kv_dtype,
        "weights": cfg.weights,
        "experts": cfg.experts,
        "reference_layers": cfg.reference_layers, "reference_batches": cfg.reference_batches,
        "references": cfg.references, "reference_rounds": cfg.reference_rounds, "measured_cases": len(cases),
        "rounds": cfg.rounds, "intervals": INTERVALS[cfg.rounds > 1],
        "check_goal_pct": phase_check.goal_pct(cfg.device),
        "check_verdicts": phase_check.verdict_counts(tables["reference"]),
        "over_goal": phase_check.verdict_notes(tables["reference"], "over"),
        "unresolved": phase_check.verdict_notes(tables["reference"], "unresolved"),
        "iteration_ms": {f"{p} {b} {t}": round(v[0], 6) for (p, b, t), v in iterations.items()},
        "hybrid_checked": int(tables["hybrid_check"]["checked"].sum()),
        "hybrid_unchecked": int((~tables["hybrid_check"]["checked"].astype(bool)).sum()),
        "hybrid_over_goal": int(tables["hybrid_check"]["over_goal"].sum()),
        "hybrid_unresolved": int((tables["hybrid_check"]["verdict"] == "unresolved").sum()),
        "hybrid_noisy_left_out": len(measured_hybrid(cfg, quiet=False)) - len(measured_hybrid(cfg)),
        "speculate": None if not cfg.speculate else {
            **dataclasses.asdict(cfg.speculate), "batches": cfg.reference_batches,
            "loop_over_goal": int(tables["speculative_check"]["over_goal"].sum()),
            "loop_unresolved": int((tables["speculative_check"]["verdict"] == "unresolved").sum())}},
        indent=1))
    return tables


def speculative_tables(cfg: PhasesConfig, df: pd.DataFrame, timer: TimerConfig,
                       impls: dict) -> dict[str, pd.DataFrame]:
    """speculative.csv (per batch, γ and α, composed from the published rows) and speculative_check.csv (the
    composition of the loop's cut models against the real loop, timed around rounds of the ops it composes to)."""
    spec, page = cfg.speculate, cfg.page_size
    frame = functools.partial(pm.Measured, dtype=cfg.dtype, impls=cfg.impls)

    def steps(rows, target, draft, plain=()):
        return sp.composed_steps(target, draft, frame(rows, model=target.name), frame(rows, model=draft.name),
                                 cfg.reference_batches, cfg.context, spec.gammas, page, plain_batches=plain)

    # plain decode may be padded to any batch of the decode sweep (measured for the sweep)
    table = sp.speculative_table(steps(df, cfg.model, spec.draft, cfg.batches), cfg.reference_batches, cfg.context,
                                 spec.gammas, spec.alphas)
    layers = cfg.reference_layers
    draft_layers = speculative_loop.draft_depth(cfg.model, spec.draft, layers)
    target, draft = speculative_loop.cut(cfg.model, layers), speculative_loop.cut(spec.draft, draft_layers)
    deep_target, deep_draft = speculative_loop.cut(cfg.model, 2 * layers), speculative_loop.cut(spec.draft,
                                                                                                  2 * draft_layers)
    pairs = dict.fromkeys(((target.layers, draft.layers), (deep_target.layers, deep_draft.layers)))
    plan = speculative_loop.LoopPlan(deep_target, deep_draft, str(cfg.device), cfg.dtype,
                                     tuple(cfg.reference_batches), cfg.context, tuple(spec.gammas),
                                     tuple(spec.alphas), spec.iterations,
                                     depths=tuple(t for t, _ in pairs), draft_depths=tuple(d for _, d in pairs))
    uses = [(target, u) for u in step_defs.distinct_uses(
        [step_defs.decode_step(target, b, cfg.context) for b in plan.batches]
        + [step_defs.verify_step(target, b, cfg.context, g) for b in plan.batches for g in plan.gammas])]
    uses += [(draft, u) for u in step_defs.distinct_uses([step_defs.decode_step(draft, b, cfg.context)
                                                          for b in plan.batches])]
    cases = [case_of(u, cfg.dtype, model.name) for model, u in uses]
    loops, rows = speculative_loop.run_loop_check(plan, cases, impls, cfg.out_dir / "speculative", timer=timer,
                                                  isolation=cfg.isolation, rounds=spec.rounds, on_row=cfg.on_row)
    deep = None if deep_target.layers == target.layers else {  # the per-layer check: the loop at L and 2L
        "layers": deep_target.layers, "draft_layers": deep_draft.layers,
        "published": steps(df, deep_target, deep_draft)}
    checked = sp.loop_check_table(loops, steps(rows, target, draft), steps(df, target, draft),
                                  layers=target.layers, draft_layers=draft.layers,
                                  goal_pct=phase_check.goal_pct(cfg.device), deep=deep)
    return {"speculative": table, "speculative_check": checked,
            "speculative_loops": loops.drop(columns=["ms", "tokens"]).assign(
                iterations=[len(m) if isinstance(m, list) else 0 for m in loops["ms"]],
                mean_ms=[float(sum(m) / len(m)) if isinstance(m, list) and m else float("nan") for m in loops["ms"]],
                tokens=[int(sum(t)) if isinstance(t, list) else 0 for t in loops["tokens"]])}
