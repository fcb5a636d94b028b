"""`phasebench phases`: measure what a decoder's steps run, compose TTFT/TPOT/tokens/s, check a real forward pass."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from ...analysis import phase_model as pm
from ..instruments.roofline import TORCH_DTYPES
from ..instruments.timing import TimerConfig
from ..ops.attention.cases import AttentionCase
from ..ops.elementwise.cases import ElementwiseCase
from ..ops.linear.cases import LinearCase
from ..spec import steps as step_defs
from ..spec.models import DecoderConfig
from ..sweep.runner import CUDA_TIMER, RunConfig, run

CASE_TYPES = {"attention": AttentionCase, "linear": LinearCase, "elementwise": ElementwiseCase}
# The host sizes keep `phasebench phases` to about two minutes on 2 cores; a GPU takes the real ones.
HOST = dict(prompts=(32, 128), batches=(1, 2, 4, 8, 16), context=128, chunks=(32, 64), chunk_batch=4,
            reference_layers=2)
# short per-op sampling on the host: about 190 ops to measure in two minutes
HOST_TIMER = TimerConfig(warmup_s=0.02, budget_s=0.15, min_samples=3, max_samples=200, flush_l2=False, cold=True)
GPU = dict(prompts=(512, 2048, 8192), batches=(1, 4, 16, 64, 128, 256), context=4096, chunks=(256, 512, 1024, 2048),
           chunk_batch=32, reference_layers=4)
REFERENCE_TIMER = {"cpu": TimerConfig(warmup_s=0.05, budget_s=0.5, min_samples=3, max_samples=20, flush_l2=False),
                   "cuda": TimerConfig(warmup_s=0.1, budget_s=0.5, min_samples=5, max_samples=50)}
LEFT_OUT = ("embedding lookup (the reference feeds hidden states)", "host gaps between ops (Python, launches, "
            "allocation), which the composition never sees", "sampling beyond the greedy pick")


def ops_timer(device: torch.device, sample_time: float | None = None, warm: bool = False) -> TimerConfig:
    """How each op of the composition is timed: the runner's CUDA timer, or short host sampling with the weights
    and the KV cache cold (warm caches with `warm`); `sample_time` replaces the seconds of samples per op."""
    timer = CUDA_TIMER if device.type == "cuda" else HOST_TIMER
    if warm:
        timer = dataclasses.replace(timer, cold=False)
    return timer if sample_time is None else dataclasses.replace(timer, budget_s=sample_time)


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
    impls: dict[str, str] = field(default_factory=lambda: dict(pm.DEFAULT_IMPLS))
    timer: TimerConfig | None = None
    on_row: object = None
    page_size: int = 0  # decode and chunk attention read the KV cache in pages of this many tokens (0: contiguous)

    @classmethod
    def defaults(cls, model: DecoderConfig, device: torch.device, out_dir: Path, **given) -> PhasesConfig:
        sizes = {**(GPU if device.type == "cuda" else HOST), **{k: v for k, v in given.items() if v is not None}}
        sizes.setdefault("chunk_prompt", max(sizes["prompts"]))
        sizes.setdefault("dtype", "bfloat16" if device.type == "cuda" else "float32")
        return cls(model, device, Path(out_dir), **sizes)


def scenario_steps(cfg: PhasesConfig) -> list[list[step_defs.OpUse]]:
    """Every step the composition will sum, so that each op it needs is measured once."""
    m, out = cfg.model, []
    out += [step_defs.prefill_step(m, p) for p in (*cfg.prompts, cfg.chunk_prompt)]
    out += [step_defs.decode_step(m, b, c, cfg.page_size) for b in sorted({*cfg.batches, cfg.chunk_batch})
            for c in sorted({cfg.context, *cfg.prompts})]
    for chunk in cfg.chunks:
        for batch in (cfg.chunk_batch, 0):
            out += step_defs.chunked_prefill_steps(m, cfg.chunk_prompt, chunk, batch, cfg.context, cfg.page_size)
    return out


def case_of(use: step_defs.OpUse, dtype: str, model: str):
    """The measured case an OpUse names: its operator's case type built from the use's fields."""
    return CASE_TYPES[use.op](**use.field_dict, dtype=dtype, model=model)


def compose(df: pd.DataFrame, cfg: PhasesConfig) -> dict[str, pd.DataFrame]:
    """The phase tables from measured rows (analysis does the arithmetic; no measurement here)."""
    measured = pm.Measured(df, model=cfg.model.name, dtype=cfg.dtype, impls=cfg.impls)
    page = cfg.page_size
    return {
        "prefill": pm.prefill_table(measured, cfg.model, cfg.prompts),
        "decode": pm.batch_sweep(measured, cfg.model, cfg.batches, cfg.context, page_size=page),
        "chunked": pm.chunk_table(measured, cfg.model, cfg.chunk_prompt, cfg.chunks, cfg.chunk_batch, cfg.context,
                                  page),
        "interactive": pm.interactive_limits(measured, cfg.model, cfg.prompts, cfg.batches, page_size=page),
        "decode_parts": pm.tpot(measured, cfg.model, cfg.chunk_batch, cfg.context, page).items,
    }


def check_against_reference(df: pd.DataFrame, cfg: PhasesConfig) -> pd.DataFrame:
    """Time a plain-PyTorch decoder of `reference_layers` layers (prefill of chunk_prompt, a decode step of
    chunk_batch at context) and compare with the composition of the same layer count from the rows. The decoder
    keeps a contiguous cache: with page_size, the gap includes what the pages cost."""
    from .reference_decoder import ReferenceDecoder, time_decode_step, time_prefill

    small = dataclasses.replace(cfg.model, layers=cfg.reference_layers)
    measured = pm.Measured(df, model=cfg.model.name, dtype=cfg.dtype, impls=cfg.impls)
    decoder = ReferenceDecoder(small, cfg.reference_layers, cfg.device, TORCH_DTYPES[cfg.dtype],
                               max_tokens=max(cfg.chunk_prompt, cfg.context + 1), max_batch=cfg.chunk_batch)
    timer = REFERENCE_TIMER["cuda" if cfg.device.type == "cuda" else "cpu"]
    prefill = time_prefill(decoder, 1, cfg.chunk_prompt, timer)
    decode = time_decode_step(decoder, cfg.chunk_batch, cfg.context, timer)
    del decoder
    rows = []
    for phase, timing, composed in (
            ("prefill", prefill, pm.ttft(measured, small, cfg.chunk_prompt)),
            ("decode", decode, pm.tpot(measured, small, cfg.chunk_batch, cfg.context, cfg.page_size))):
        rows.append({"phase": phase, "layers": cfg.reference_layers,
                     "batch": 1 if phase == "prefill" else cfg.chunk_batch,
                     "tokens": cfg.chunk_prompt if phase == "prefill" else cfg.context,
                     "reference_ms": timing.median_ms, "reference_p20_ms": timing.percentile_ms(20),
                     "reference_p80_ms": timing.percentile_ms(80), "samples": timing.count,
                     "composed_ms": composed.total_ms, "error_pct": pm.model_error(composed.total_ms, timing.median_ms),
                     "left_out": "; ".join(LEFT_OUT)})
    return pd.DataFrame(rows)


def run_phases(cfg: PhasesConfig, reuse: pd.DataFrame | None = None) -> dict[str, pd.DataFrame]:
    """Measure (or reuse) the ops, check a real forward pass, compose, and write every table under out_dir."""
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    uses = step_defs.distinct_uses(scenario_steps(cfg))
    if reuse is not None:  # measure only what the given results lack
        have = pm.Measured(reuse, model=cfg.model.name, dtype=cfg.dtype, impls=cfg.impls)
        uses = [u for u in uses if have.latency_ms(u) is None]
    cases = [case_of(u, cfg.dtype, cfg.model.name) for u in uses]
    impls = {op: [name] for op, name in cfg.impls.items()}
    timer = cfg.timer or ops_timer(cfg.device)
    rows = run(RunConfig(cases, impls, cfg.device, cfg.out_dir / "ops", suite="phases", timer=timer,
                         on_row=cfg.on_row)) if cases else pd.DataFrame()
    df = pd.concat([x for x in (reuse, rows) if x is not None and len(x)], ignore_index=True)
    tables = compose(df, cfg)
    tables["reference"] = check_against_reference(df, cfg)
    for name, table in tables.items():
        table.to_csv(cfg.out_dir / f"{name}.csv", index=False)
    (cfg.out_dir / "phases.json").write_text(json.dumps({
        "model": dataclasses.asdict(cfg.model), "device": str(cfg.device), "dtype": cfg.dtype, "impls": cfg.impls,
        "prompts": cfg.prompts, "batches": cfg.batches, "context": cfg.context, "chunks": cfg.chunks,
        "chunk_batch": cfg.chunk_batch, "chunk_prompt": cfg.chunk_prompt, "page_size": cfg.page_size,
        "reference_layers": cfg.reference_layers, "measured_cases": len(cases)}, indent=1))
    return tables
