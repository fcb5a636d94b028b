"""`phasebench interference`: the hybrid iteration (a prompt's arrival, whole or chunked, in the decode users'
iterations; bench.phases.run_hybrid), and spatial sharing: a real decode step timed alone, beside a looped prefill of
the same model on the same device, and protected from it (a high-priority stream, reserved cores)."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from ...instruments.contention import ContentionProbe, snapshot
from ...instruments.roofline import TORCH_DTYPES
from ...instruments.timing import TimerConfig, time_call
from ...spec.interference_schema import CSV_NAME, INTERFERENCE_SCHEMA, RUN_JSON, WHOLE, conform_interference
from ...spec.models import DecoderConfig
from ...spec.store.files import write_file, write_table
from ...spec.store.folder_lock import holding
from ...sweep.measure import one_line
from ...sweep.metadata import run_metadata
from ...sweep.runner import new_run_id, now
from ..reference_decoder import HOST_LAYERS, ReferenceDecoder, activation_bytes, cache_bytes, weight_bytes
from .corunner import (
    HIGHEST_PRIORITY,
    LOWEST_PRIORITY,
    CoRunnerError,
    Placement,
    PrefillSpec,
    ProcessCoRunner,
    StreamCoRunner,
    allowed_cpus,
    covered_share,
    place_host,
    split_cpus,
)
from .rows import MAX_STRETCH_WINDOW, base_row, median_or_nan, mode_rows, progress_line
from .run_hybrid import check_chunks, measure_hybrid

# A small decoder for the host: a decode step of a few ms and a 512-token prefill of a few hundred on 2 cores.
HOST_MODEL = "name=interference-host,hidden=512,intermediate=1536,layers=2,q_heads=8,kv_heads=2,head_dim=64,vocab=8192"
HOST = dict(prompts=(128, 512), batches=(1, 8), context=256, window_s=1.0, rounds=2, arrivals=4,
            chunks=(64, 128, 256, 512, WHOLE))
GPU = dict(prompts=(2048, 8192), batches=(16, 64), context=4096, window_s=1.0, rounds=3, arrivals=10,
           chunks=(256, 512, 1024, 2048, WHOLE))
FORMS = ("hybrid", "spatial")  # the hybrid iteration; two engines side by side
UNPINNED = "threads split, unpinned"  # the host's control: disjoint cores' thread counts without their pinning
WARMUP_S = 0.05
ALONE_PREFILLS = 2  # prefill iterations timed alone per prompt and round, at least (and for half a window)
FIT_HEADROOM = 0.85
NOISE_RULE = ("a window is noisy when processes other than this one and its co-runner used a quarter of a core or "
              "more of the CPUs while the decode was sampled (/proc/stat busy ticks less our CPU time and the "
              "co-runner's, by pid), or another compute process than ours was on the GPU, or its clocks throttled; "
              "our threads' run-queue wait does not count (beside the co-runner it is its doing)")


@dataclass(frozen=True)
class Mode:
    """How the decode step runs in one measurement: alone, or beside a prefill co-runner, where each side runs."""

    name: str  # alone, colocated, protected
    mechanism: str  # alone, process, stream, disjoint cores, priority stream
    runner: str | None  # the co-runner: "process", "stream" or None
    decode: Placement
    prefill: Placement = Placement()

    @property
    def key(self) -> tuple[str, str]:
        return self.name, self.mechanism


def plan_modes(device: torch.device, cpus: frozenset[int]) -> tuple[list[Mode], dict[tuple[str, str], str]]:
    """The spatial modes measured on this device, and those that cannot be, with why. Host: the prefill in a second
    process (each side with as many threads as CPUs); the control, each side with half the threads, unpinned (the end
    of oversubscription alone); then the two on disjoint cores (half each, threads to match: the control and
    pinning). GPU: a second stream of this process and a second process, then the decode on a high-priority
    stream."""
    if device.type == "cuda":
        low, high = Placement(priority=LOWEST_PRIORITY), Placement(priority=HIGHEST_PRIORITY)
        return [Mode("alone", "alone", None, low), Mode("colocated", "stream", "stream", low, low),
                Mode("colocated", "process", "process", low), Mode("protected", "priority stream", "stream", high, low)
                ], {}
    every = Placement(cpus, len(cpus))
    modes = [Mode("alone", "alone", None, every), Mode("colocated", "process", "process", every, every)]
    split = split_cpus(cpus)
    if split is None:
        why = f"needs 2 CPUs to split, {len(cpus)} allowed"
        return modes, {("colocated", UNPINNED): why, ("protected", "disjoint cores"): why}
    decode, prefill = split
    return modes + [Mode("colocated", UNPINNED, "process", Placement(threads=len(decode)),
                         Placement(threads=len(prefill))),
                    Mode("protected", "disjoint cores", "process", Placement(decode, len(decode)),
                         Placement(prefill, len(prefill)))], {}


@dataclass
class InterferenceConfig:
    """A model, its decode batches and prompts on one device, and how long and often each mode is sampled."""

    model: DecoderConfig
    device: torch.device
    out_dir: Path
    dtype: str
    prompts: tuple[int, ...]
    batches: tuple[int, ...]
    context: int
    layers: int
    window_s: float
    rounds: int
    chunks: tuple = (WHOLE,)  # the hybrid form's tokens per iteration: ints, and WHOLE for the prompt at once
    arrivals: int = 4  # the hybrid form's rounds: one arrival per (batch, prompt, chunk) each
    forms: tuple[str, ...] = FORMS
    seed: int = 0
    on_line: object = None  # called with each progress line
    on_written: object = None  # called with the rows once written, before the co-runners close (figures: a stop's
    # grace may end during the close, which takes seconds)

    @classmethod
    def defaults(cls, model: DecoderConfig, device: torch.device, out_dir: Path, **given) -> InterferenceConfig:
        sizes = {**(GPU if device.type == "cuda" else HOST), **{k: v for k, v in given.items() if v is not None}}
        sizes.setdefault("dtype", "bfloat16" if device.type == "cuda" else "float32")
        if sizes["dtype"] not in TORCH_DTYPES:
            raise ValueError(f"dtype: unknown dtype {sizes['dtype']!r}, choose from {', '.join(TORCH_DTYPES)}")
        if sizes.get("layers") is None:
            sizes["layers"] = default_layers(model, device, sizes["dtype"], sizes["batches"], sizes["context"],
                                             sizes["prompts"])
        cfg = cls(model, device, Path(out_dir), **sizes)
        cfg.check()
        return cfg

    def check(self) -> None:
        """One-line ValueErrors for sizes that cannot run."""
        for name, option in (("prompts", "prompt"), ("batches", "batch")):
            values = getattr(self, name)
            if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
                raise ValueError(f"{option}: must be positive ints, got {list(values)}")
        for name in ("context", "rounds", "arrivals"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be a positive int, got {value!r}")
        if self.dtype not in TORCH_DTYPES:
            raise ValueError(f"dtype: unknown dtype {self.dtype!r}, choose from {', '.join(TORCH_DTYPES)}")
        if not 1 <= self.layers <= self.model.layers:
            raise ValueError(f"layers: {self.layers} is not in 1..{self.model.layers} for {self.model.name}"
                             + (" (none fits in this GPU's free memory)" if self.layers == 0 else ""))
        if not self.window_s > 0:
            raise ValueError(f"window: must be a positive number of seconds, got {self.window_s!r}")
        if not self.forms or set(self.forms) - set(FORMS):
            raise ValueError(f"form: must be some of {', '.join(FORMS)}, got {list(self.forms)}")
        check_chunks(self.chunks, self.prompts)


def default_layers(model: DecoderConfig, device: torch.device, dtype: str, batches, context: int, prompts) -> int:
    """HOST_LAYERS on the host; on a GPU the most layers that fit three copies of the weights (the decode's, the
    prefill stream's and the prefill process's), the caches (the decode users' and the arriving prompt's rows) and the
    prefills' temporaries in its free memory."""
    if device.type != "cuda":
        return min(HOST_LAYERS, model.layers)
    kind, free = TORCH_DTYPES[dtype], torch.cuda.mem_get_info(device)[0]

    def need(n: int) -> int:
        return (3 * weight_bytes(model, n, kind)
                + cache_bytes(model, n, max(batches) + 1, max(context + 1, max(prompts)), kind)
                + 2 * cache_bytes(model, n, 1, max(prompts), kind) + 2 * activation_bytes(model, 1, max(prompts), kind)
                + activation_bytes(model, max(batches), 1, kind))

    return max((n for n in range(1, model.layers + 1) if need(n) <= FIT_HEADROOM * free), default=0)


@dataclass
class Window:
    """One mode's decode samples in one round, the prefill iterations wholly inside them, and the probe's verdict."""

    samples_ms: tuple[float, ...]
    prefill_ms: list[float] = field(default_factory=list)
    covered: float | None = None  # the share of the window the prefill's iterations covered
    noisy: bool = False
    reason: str = ""
    others_cores: float | None = None


class Session:
    """The decoder, the co-runners and the decode streams of one run; `window` times one mode."""

    def __init__(self, cfg: InterferenceConfig, modes: list[Mode]):
        self.cfg, self.device = cfg, cfg.device
        self.every = allowed_cpus()
        self.probe = ContentionProbe(self.device, cpus=set(self.every))
        small = dataclasses.replace(cfg.model, layers=cfg.layers)
        spec = PrefillSpec(small, cfg.layers, str(self.device), cfg.dtype, max(cfg.prompts), seed=cfg.seed + 1)
        self.runners: dict[str, object] = {}
        self.broken: dict[str, str] = {}  # a co-runner that could not start, and why
        kinds = sorted({m.runner for m in modes if m.runner}, key=lambda k: k != "process")  # a process builds
        for kind in kinds:  # while we do, so it is spawned first
            self._start(kind, lambda kind=kind: (ProcessCoRunner if kind == "process" else StreamCoRunner)(spec))
        self._streams: dict[int, torch.cuda.Stream] = {}
        self._heads: dict[int, float] = {}
        try:
            # the users' rows, and one more for the hybrid form's arriving prompt
            self.decoder = ReferenceDecoder(small, cfg.layers, self.device, TORCH_DTYPES[cfg.dtype],
                                            max_tokens=max(cfg.context + 1, max(cfg.prompts)),
                                            max_batch=max(cfg.batches) + 1, seed=cfg.seed)
            for batch in cfg.batches:  # the cache filled, the kernels loaded
                self.decoder.decode_step(batch, cfg.context)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)  # written on the default stream, read on the decode streams
            for kind, runner in list(self.runners.items()):
                self._start(kind, lambda runner=runner: runner.wait_ready() or runner)
        except BaseException:  # out of memory, an interrupt: no co-runner outlives us
            self.close()
            raise

    def _start(self, kind: str, make) -> None:
        try:
            self.runners[kind] = make()
        except (CoRunnerError, RuntimeError) as err:
            self.broken[kind] = one_line(err)
            gone = self.runners.pop(kind, None)
            if gone is not None:
                gone.close()

    def _decode_stream(self, placement: Placement):
        if self.device.type != "cuda":
            place_host(placement, self.every)
            return None
        if placement.priority not in self._streams:
            self._streams[placement.priority] = torch.cuda.Stream(self.device, priority=placement.priority)
        return self._streams[placement.priority]

    def prefill_alone(self, kind: str, prompt: int) -> list[float]:
        """The prefill of `prompt` tokens by itself on co-runner `kind`, in ms per iteration."""
        if self.device.type != "cuda":
            place_host(Placement(), self.every)  # our threads idle: the prefill has the whole host
        placement = Placement(priority=LOWEST_PRIORITY) if self.device.type == "cuda" else Placement()
        spans = self.runners[kind].alone(prompt, placement, self.cfg.window_s / 2, ALONE_PREFILLS)
        return [(end - start) * 1e3 for start, end in spans]

    def window(self, mode: Mode, batch: int, prompt: int, prefill_alone_s: float = 0.0) -> Window:
        """The decode step sampled for window_s (longer, when co-located, until a whole prefill iteration lies in
        the window: up to MAX_STRETCH_WINDOW windows or prefills alone) with the mode's co-runner looping the
        prefill from before the first sample to after the last."""
        cfg, runner = self.cfg, self.runners.get(mode.runner) if mode.runner else None
        if mode.runner and runner is None:
            raise CoRunnerError(self.broken.get(mode.runner, f"no {mode.runner} co-runner"))
        stream = self._decode_stream(mode.decode)
        context = cfg.context

        def call():
            return self.decoder.decode_step(batch, context).cpu()  # the token read back, as a serving loop does

        timer = TimerConfig(warmup_s=WARMUP_S, budget_s=cfg.window_s, min_samples=3, max_samples=1_000_000,
                            flush_l2=False)
        more = dataclasses.replace(timer, warmup_s=0.0, budget_s=cfg.window_s / 2)
        # our co-runners, idle or not: a GPU lists an idle process's context too
        companions = tuple(r.pid for r in self.runners.values() if r.pid)
        if runner is not None:
            runner.start(prompt, mode.prefill)
        spans = []
        try:
            with self.probe.watch(companions) as watch:
                start = time.monotonic()
                samples = list(time_call(call, self.device, timer, stream=stream).samples_ms)
                while (runner is not None and runner.latest_done_start() < start
                       and time.monotonic() - start < MAX_STRETCH_WINDOW * max(cfg.window_s, prefill_alone_s)):
                    samples += time_call(call, self.device, more, stream=stream).samples_ms
                end = time.monotonic()
        finally:
            if runner is not None:
                spans, _ = runner.stop()
        found = Window(tuple(samples), noisy=watch.noisy, reason=watch.reason,
                       others_cores=watch.stats.get("other_cores"))
        if runner is not None:
            found.prefill_ms = [(b - a) * 1e3 for a, b in spans if a >= start and b <= end]
            found.covered = covered_share(spans, start, end)
        return found

    def head_ms(self, batch: int) -> float:
        """The final norm, lm_head and greedy pick over `batch` tokens, timed alone (ms, median; kept per batch)."""
        if batch not in self._heads:
            d = self.decoder
            x = torch.randn(batch, d.config.hidden, device=self.device).to(d.dtype)
            timer = TimerConfig(warmup_s=WARMUP_S, budget_s=0.2, min_samples=5)
            with torch.inference_mode():
                timed = time_call(lambda: d.greedy(d.lm_head(d.final_norm(x))), self.device, timer)
            self._heads[batch] = timed.median_ms
        return self._heads[batch]

    def close(self) -> None:
        for runner in self.runners.values():
            runner.close()
        if self.device.type != "cuda":
            place_host(Placement(), self.every)


def run_interference(cfg: InterferenceConfig) -> pd.DataFrame:
    """The hybrid form (bench.phases.run_hybrid), then the spatial one: every (batch, prompt, mode) in rounds (the
    modes' order turned each round, so drift spreads over them), each mode's windows pooled; writes
    interference.csv and run.json under out_dir (held against a second writer; each renamed into place whole);
    returns the rows."""
    with holding(cfg.out_dir):
        return _run_interference(cfg)


def _run_interference(cfg: InterferenceConfig) -> pd.DataFrame:
    say = cfg.on_line or (lambda line: None)
    modes, skipped = plan_modes(cfg.device, allowed_cpus()) if "spatial" in cfg.forms else ([], {})
    meta = run_metadata(cfg.device)  # before measuring: a budget's interrupt leaves time only for writing
    meta.update(interference_schema=INTERFERENCE_SCHEMA, kind="interference", run_id=new_run_id(),
                model=dataclasses.asdict(cfg.model), layers=cfg.layers, dtype=cfg.dtype, prompts=cfg.prompts,
                batches=cfg.batches, context=cfg.context, window_s=cfg.window_s, rounds=cfg.rounds,
                forms=cfg.forms, chunks=cfg.chunks, arrivals=cfg.arrivals,
                noise=NOISE_RULE, modes=[{"mode": m.name, "mechanism": m.mechanism, "decode": m.decode.describe(),
                                          "prefill": m.prefill.describe() if m.runner else ""} for m in modes],
                skipped={f"{n}/{m}": why for (n, m), why in skipped.items()}, state_before=snapshot(cfg.device))
    windows: dict[tuple, list[Window]] = defaultdict(list)
    alone_prefill: dict[tuple, list[float]] = defaultdict(list)
    errors: dict[tuple, str] = {}
    session, interrupted, hybrid, stopped = None, False, [], []
    try:
        session = Session(cfg, modes)
        for kind, why in session.broken.items():
            say(f"the {kind} co-runner did not start: {why}")
        if "hybrid" in cfg.forms:
            if cfg.device.type != "cuda":
                place_host(Placement(), session.every)
            companions = tuple(r.pid for r in session.runners.values() if r.pid)  # idle, but ours
            hybrid = measure_hybrid(cfg, session.decoder, say, stopped,
                                    watch=lambda: session.probe.watch(companions))
            if stopped:
                raise KeyboardInterrupt
        for round_ in range(cfg.rounds if modes else 0):
            for prompt in cfg.prompts:
                for kind in session.runners:
                    try:
                        alone_prefill[(prompt, kind)] += session.prefill_alone(kind, prompt)
                    except (CoRunnerError, RuntimeError) as err:
                        errors.setdefault((prompt, kind), one_line(err))
                for batch in cfg.batches:
                    turn = round_ % len(modes)
                    for mode in modes[turn:] + modes[:turn]:
                        try:
                            alone_s = median_or_nan(alone_prefill.get((prompt, mode.runner), [])) / 1e3
                            windows[(batch, prompt, mode.key)].append(
                                session.window(mode, batch, prompt, alone_s if math.isfinite(alone_s) else 0.0))
                        except (CoRunnerError, RuntimeError) as err:  # out of memory, a co-runner that died
                            errors.setdefault((batch, prompt, mode.key), one_line(err))
                    say(progress_line(round_, cfg.rounds, batch, prompt, modes, windows))
    except KeyboardInterrupt:  # stopped (a budget's SIGINT): the windows measured so far make the rows
        interrupted = True
        say("interrupted: the rows hold the windows measured so far")
    except BaseException:
        if session is not None:
            session.close()
        raise
    try:  # written before the co-runners are closed, which takes seconds
        for key in ((b, p, m.key) for b in cfg.batches for p in cfg.prompts for m in modes):
            if interrupted and not windows.get(key):
                errors.setdefault(key, "not measured: interrupted")
        heads = {b: session.head_ms(b) for b in cfg.batches if modes and not interrupted} if session else {}
        rows = [{**base_row(cfg, b), **r} for r in hybrid for b in (r["batch"],)]
        rows += [row for batch in cfg.batches for prompt in cfg.prompts
                 for row in mode_rows(cfg, modes, skipped, batch, prompt, windows, alone_prefill, errors,
                                      heads.get(batch, math.nan))]
        stamp = now()
        table = conform_interference(pd.DataFrame([{"run_id": meta["run_id"], "time": stamp, **r} for r in rows]))
        write_table(cfg.out_dir / CSV_NAME, table)
        meta.update(interrupted=interrupted, state_after=snapshot(cfg.device))
        write_file(cfg.out_dir / RUN_JSON, json.dumps(meta, indent=1, default=str))
        if cfg.on_written is not None:
            cfg.on_written(table)
    finally:
        if session is not None:
            session.close()
    table.attrs["interrupted"] = interrupted
    return table
