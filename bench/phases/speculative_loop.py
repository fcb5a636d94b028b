"""A real speculative decoding loop on two reference decoders (a draft and a target with random weights), timed as the
check of the speculative composition.

Random weights make the draft's proposals meaningless to the target, so acceptance is drawn instead: a seeded
Bernoulli(α) per proposed token, the loop keeps the drawn prefix and appends the target's own token at the first
rejection (or after the last proposal). Rejected tokens are rolled back by position: both caches are extended next
from the accepted length, over the rejected rows. The batch's sequences share each iteration's draws (one start per
extend), so every sequence gains the same tokens.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ..spec.models import DecoderConfig
from .reference_decoder import ReferenceDecoder

EMBED_ROWS = 1024  # the embedding stand-in: seeded rows indexed by token id modulo this (a lookup, not timed as an op)
WARMUP_ITERATIONS = 2


def draws(seed, iterations: int, gamma: int, alpha: float) -> np.ndarray:
    """The acceptance of each proposed token, [iterations, gamma] booleans, seeded (an int or a list of ints)."""
    return np.random.default_rng(seed).random((iterations, gamma)) < alpha


def accepted(row) -> int:
    """Leading acceptances of one iteration's draws: the proposals kept."""
    row = np.asarray(row, dtype=bool)
    return int(row.argmin()) if not row.all() else len(row)


class SpeculativeLoop:
    """Draft-then-verify iterations of `batch` sequences after `context` cached tokens (the caches' seeded random
    rows stand for the prompt). `length` is the target's valid cache rows, `last` the newest token (fed to neither
    model yet), `pending` the tokens the draft has not seen (last, and the final proposal when all were kept)."""

    def __init__(self, target: ReferenceDecoder, draft: ReferenceDecoder, batch: int, context: int, seed: int = 0,
                 depths: tuple[int | None, int | None] = (None, None)):
        if target.config.vocab != draft.config.vocab:
            raise ValueError(f"draft: vocabulary {draft.config.vocab} is not the target's {target.config.vocab}")
        self.target, self.draft, self.batch, self.context = target, draft, batch, context
        self.depth, self.draft_depth = depths  # the first layers of each that run (None: all built)
        gen = torch.Generator().manual_seed(seed * 7919 + 11)
        self.tables = {id(m): torch.randn(EMBED_ROWS, m.config.hidden, generator=gen, dtype=torch.float64)
                       .to(device=m.device, dtype=m.dtype) for m in (target, draft)}
        self.first = torch.randint(0, target.config.vocab, (batch, 1), generator=gen).to(target.device)
        self.reset()

    def reset(self) -> None:
        """Back to `context` cached tokens (rows past it are overwritten as the loop goes)."""
        self.length, self.draft_length = self.context, self.context
        self.last, self.pending = self.first.clone(), self.first.clone()

    def _embed(self, model: ReferenceDecoder, ids: torch.Tensor) -> torch.Tensor:
        return self.tables[id(model)][ids % EMBED_ROWS]

    def propose(self, gamma: int) -> torch.Tensor:
        """γ draft tokens [batch, γ], one decode step each (the first also feeds what the draft has not seen)."""
        out = []
        ids = self.draft.extend(self.batch, self.draft_length, self.pending.shape[1],
                                x=self._embed(self.draft, self.pending), depth=self.draft_depth)
        out.append(ids.view(self.batch, 1))
        for i in range(1, gamma):
            ids = self.draft.decode_step(self.batch, self.length + i, x=self._embed(self.draft, out[-1]),
                                         depth=self.draft_depth)
            out.append(ids.view(self.batch, 1))
        return torch.cat(out, dim=1)

    def verify(self, proposals: torch.Tensor) -> torch.Tensor:
        """The target over [last, proposals] at the accepted length, the head on every position: its token after
        each, [batch, γ + 1]."""
        fed = torch.cat((self.last, proposals), dim=1)
        return self.target.extend(self.batch, self.length, fed.shape[1], x=self._embed(self.target, fed),
                                  every_position=True, depth=self.depth).view(self.batch, -1)

    def iteration(self, acceptance) -> torch.Tensor:
        """One draft-then-verify iteration with these draws (γ booleans): the tokens it yields, [batch, n + 1]."""
        gamma = len(acceptance)
        proposals = self.propose(gamma)
        checked = self.verify(proposals)
        n = accepted(acceptance)
        return self.keep(proposals, checked, n)

    def keep(self, proposals: torch.Tensor, checked: torch.Tensor, n: int) -> torch.Tensor:
        """Keep n proposals and the target's token after them; the rest is rolled back by position."""
        gamma = proposals.shape[1]
        tokens = torch.cat((proposals[:, :n], checked[:, n:n + 1]), dim=1)
        self.length += n + 1  # the target holds last and the n kept proposals
        self.draft_length = min(self.length, self.length - n - 1 + gamma)  # the draft fed last .. proposal γ-1
        self.last = tokens[:, -1:]
        self.pending = torch.cat((proposals[:, -1:], self.last), dim=1) if n == gamma else self.last
        return tokens

    def feed(self, tokens: torch.Tensor) -> None:
        """Feed `tokens` ([batch, t], starting with last) to both models as plain context, no proposal: what a loop
        that never proposed a rejected token holds; the token after them becomes `last`."""
        t = tokens.shape[1]
        ids = self.target.extend(self.batch, self.length, t, x=self._embed(self.target, tokens), depth=self.depth)
        self.draft.extend(self.batch, self.length, t, x=self._embed(self.draft, tokens), depth=self.draft_depth)
        self.length += t
        self.draft_length = self.length
        self.last = self.pending = ids.view(self.batch, 1)


@dataclass(frozen=True)
class LoopPlan:
    """What the check's loop runs: target and draft (cut to the layers built), on one device and dtype, at each of
    `depths` (the target's first L layers) with the draft's first `draft_depths` (default min(L, its own); none:
    all built)."""

    target: DecoderConfig
    draft: DecoderConfig
    device: str
    dtype: str
    batches: tuple[int, ...]
    context: int
    gammas: tuple[int, ...]
    alphas: tuple[float, ...]
    iterations: int
    seed: int = 0
    depths: tuple[int, ...] = ()
    draft_depths: tuple[int, ...] = ()

    def depth_pairs(self, bracket: int = 0) -> list[tuple[int, int]]:
        """(target depth, draft depth) per depth, their order turned every other bracket."""
        drafts = self.draft_depths or tuple(min(d, self.draft.layers) for d in self.depths)
        pairs = list(zip(self.depths, drafts, strict=True)) or [(self.target.layers, self.draft.layers)]
        return pairs if bracket % 2 == 0 else pairs[::-1]

    def max_tokens(self) -> int:
        return self.context + (self.iterations + WARMUP_ITERATIONS + 1) * (max(self.gammas) + 1) + 2


_BUILT: dict = {}  # plan -> (target, draft) decoders, kept across one check's brackets


def _decoders(plan: LoopPlan) -> tuple[ReferenceDecoder, ReferenceDecoder]:
    from ..instruments.roofline import TORCH_DTYPES

    if plan not in _BUILT:
        made = [ReferenceDecoder(config, config.layers, torch.device(plan.device), TORCH_DTYPES[plan.dtype],
                                 max_tokens=plan.max_tokens(), max_batch=max(plan.batches), seed=plan.seed + k)
                for k, config in enumerate((plan.target, plan.draft))]
        _BUILT.clear()
        _BUILT[plan] = tuple(made)
    return _BUILT[plan]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_loop(loop: SpeculativeLoop, acceptance: np.ndarray) -> tuple[list[float], list[int]]:
    """Per iteration its wall milliseconds and tokens per sequence, after WARMUP_ITERATIONS untimed ones."""
    device = loop.target.device
    loop.reset()
    for row in acceptance[:WARMUP_ITERATIONS]:
        loop.iteration(row)
    ms, tokens = [], []
    for row in acceptance[WARMUP_ITERATIONS:]:
        _sync(device)
        start = time.perf_counter_ns()
        out = loop.iteration(row)
        _sync(device)
        ms.append((time.perf_counter_ns() - start) / 1e6)
        tokens.append(int(out.shape[1]))
    return ms, tokens


def time_plain(target: ReferenceDecoder, batch: int, context: int, steps: int, depth: int | None = None) -> list[float]:
    """Plain decode on the same target (its first `depth` layers): one token per step, per step's wall
    milliseconds."""
    device, ms = target.device, []
    for i in range(steps + WARMUP_ITERATIONS):
        _sync(device)
        start = time.perf_counter_ns()
        target.decode_step(batch, context + i, depth=depth)
        _sync(device)
        if i >= WARMUP_ITERATIONS:
            ms.append((time.perf_counter_ns() - start) / 1e6)
    return ms


def time_loops(plan: LoopPlan, bracket: int, last: bool) -> list[dict]:
    """One bracket: at each depth, every (batch, γ, α) loop for plan.iterations timed iterations (draws seeded per
    bracket, the same at each depth), and plain decode per batch, watched by the contention probe; the decoders are
    freed after the last bracket."""
    from ..instruments.contention import ContentionProbe

    device = torch.device(plan.device)
    probe, rows = ContentionProbe(device), []
    try:
        target, draft = _decoders(plan)
        for depth, draft_depth in plan.depth_pairs(bracket):
            at = {"layers": depth, "draft_layers": draft_depth}
            for batch in plan.batches:
                loop = SpeculativeLoop(target, draft, batch, plan.context, plan.seed, (depth, draft_depth))
                with probe.watch() as seen:
                    plain = time_plain(target, batch, plan.context, plan.iterations, depth)
                rows.append({"kind": "plain", "bracket": bracket, **at, "batch": batch, "gamma": 0, "alpha": np.nan,
                             "ms": plain, "tokens": [1] * len(plain), "noisy": seen.noisy,
                             "noise_reason": seen.reason})
                for gamma in plan.gammas:
                    for alpha in plan.alphas:
                        seed = [plan.seed, bracket, batch, gamma, round(alpha * 1e6)]
                        acceptance = draws(seed, plan.iterations + WARMUP_ITERATIONS, gamma, alpha)
                        with probe.watch() as seen:
                            ms, tokens = time_loop(loop, acceptance)
                        rows.append({"kind": "speculative", "bracket": bracket, **at, "batch": batch, "gamma": gamma,
                                     "alpha": alpha, "ms": ms, "tokens": tokens, "noisy": seen.noisy,
                                     "noise_reason": seen.reason})
    except (RuntimeError, ValueError) as err:
        rows.append({"kind": "error", "bracket": bracket, "error": str(err).strip().splitlines()[0]})
    finally:
        if last:
            _BUILT.clear()
    return rows


def draft_depth(target: DecoderConfig, draft: DecoderConfig, layers: int) -> int:
    """The draft's layers beside `layers` of the target, in the whole models' ratio (llama-3.2-1b's 16 beside
    llama-3-8b's 32: 1 beside 2), so that a layer the loop check adds weighs draft and target as the model does."""
    return max(1, min(draft.layers, math.floor(layers * draft.layers / target.layers + 0.5)))  # halves up


def cut(config: DecoderConfig, layers: int) -> DecoderConfig:
    """`config` at min(layers, its own) layers, under its own name (the ops per layer are the same)."""
    return dataclasses.replace(config, layers=min(layers, config.layers))


def run_loop_check(plan: LoopPlan, cases, impls: dict, out_dir, *, timer, isolation, rounds: int,
                   on_row=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The ops of the loop's composition measured `rounds` times into out_dir (a run folder of suite
    phases-speculate), the loops timed before each round and after the last, on the same worker, so that both
    sides see the same machine. Returns the loops' rows (one per bracket and loop) and the ops' rows."""
    from ..sweep.runner import RunConfig, run
    from ..sweep.worker import WorkerError

    loops: list[dict] = []

    def between(executor, k: int) -> None:
        try:
            loops.extend(executor.call(time_loops, plan, k, k == rounds, doing="timing the speculative loops",
                                       timeout=None if isolation.case_timeout == 0 else 600.0))
        except WorkerError as err:
            loops.append({"kind": "error", "bracket": k, "error": str(err)})

    rows = run(RunConfig(list(cases), impls, torch.device(plan.device), out_dir, suite="phases-speculate",
                         timer=timer, isolation=isolation, rounds=rounds, between_rounds=between, on_row=on_row))
    columns = ("kind", "bracket", "layers", "draft_layers", "batch", "gamma", "alpha", "ms", "tokens", "noisy",
               "noise_reason", "error")
    return pd.DataFrame(loops, columns=list(columns)), rows
