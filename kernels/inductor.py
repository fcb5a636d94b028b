"""torch.compile with Inductor behind the registry: one compiled function per body, the first call's cost as data.

A compiled implementation's planned call compiles on its first run (its registry.CompileRecord holds what that cost:
seconds, graphs Dynamo compiled, whether Inductor's on-disk cache served them); later runs call the compiled code.
Dynamo caches graphs per code object and guards on shapes, dtypes, strides and global state (the deterministic mode
the gate's judged calls run under is one), so a sweep's cases share a graph where those agree and compile their own
where they do not. `graph_count()` is Dynamo's count of graphs compiled in this process: the harness reads it around
the timed samples, and a row during whose samples it moved recompiled (flagged, never hidden by the cache).
"""

from __future__ import annotations

import functools
import os
import shutil
import time
from collections.abc import Callable

import torch

from .registry import CompileRecord, PlannedCall

MODE_ENV = "PHASEBENCH_COMPILE_MODE"  # torch.compile's mode for the compiled impls: default, max-autotune, ...
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# Dynamo's per-code-object limit (8) would send a sweep's ninth shape to eager silently; past this it raises instead
RECOMPILE_LIMIT = 4096


def compile_mode() -> str:
    """torch.compile's mode for the compiled impls (env PHASEBENCH_COMPILE_MODE, default `default`)."""
    mode = os.environ.get(MODE_ENV, "default") or "default"
    if mode not in MODES:
        raise ValueError(f"{MODE_ENV}: unknown torch.compile mode {mode!r}, choose from {', '.join(MODES)}")
    return mode


def graph_count() -> int:
    """Graphs Dynamo has compiled in this process (every compiled body, every recompile)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _cache_counts() -> tuple[int, int]:
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["fxgraph_cache_hit"]), int(counters["inductor"]["fxgraph_cache_miss"])


CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
FRESH_ENV = "PHASEBENCH_FRESH_INDUCTOR_CACHE"  # the cache fresh_cache_dir made, for the run's worker processes


def fresh_cache_dir() -> str:
    """A run's own Inductor cache, made empty here and handed to its worker processes through the environment, so
    that its first round's compile_s is a cold compile (later rounds' read what the first wrote: `disk`); a
    TORCHINDUCTOR_CACHE_DIR already set is kept (a user who shares a warm cache on purpose)."""
    import atexit
    import tempfile

    if not os.environ.get(CACHE_ENV):
        path = tempfile.mkdtemp(prefix="phasebench-inductor-")
        os.environ[CACHE_ENV] = os.environ[FRESH_ENV] = path
        atexit.register(shutil.rmtree, path, True)
    return os.environ[CACHE_ENV]


def cache_kind() -> str:
    """Whose Inductor cache this process compiles into, in words."""
    if os.environ.get(CACHE_ENV) and os.environ.get(CACHE_ENV) == os.environ.get(FRESH_ENV):
        return "this run's own, empty at its start (round 1 compiles cold)"
    if os.environ.get(CACHE_ENV):
        return f"set by the user ({CACHE_ENV}): may be warm"
    return "Inductor's default, shared by earlier processes: may be warm"


def cache_dir() -> str:
    """Where Inductor keeps its compiled artifacts (TORCHINDUCTOR_CACHE_DIR, else its default under the temp dir)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir as inductor_cache_dir

    return inductor_cache_dir()


@functools.cache
def _configured() -> None:
    import torch._dynamo

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit,
                                                           RECOMPILE_LIMIT)
    torch._dynamo.config.fail_on_recompile_limit_hit = True  # an error, never a silent fall back to eager


@functools.cache
def compiled(fn: Callable, mode: str) -> Callable:
    """`fn` under torch.compile (Inductor, fullgraph, static shapes), one wrapper per (body, mode)."""
    _configured()
    return torch.compile(fn, backend="inductor", fullgraph=True, dynamic=False,
                         mode=None if mode == "default" else mode)


def first_call_recorded(run: Callable[[], object], record: CompileRecord) -> Callable[[], object]:
    """`run`, whose first call fills `record` (its seconds, the graphs it compiled, where they came from)."""
    def call():
        if record.done:
            return run()
        graphs, (hits, misses) = graph_count(), _cache_counts()
        start = time.perf_counter()
        out = run()
        if isinstance(out, torch.Tensor) and out.is_cuda:
            torch.cuda.synchronize(out.device)
        record.seconds = time.perf_counter() - start
        record.graphs = graph_count() - graphs
        new_hits, new_misses = _cache_counts()
        record.cache = ("memory" if record.graphs == 0 else "cold" if new_misses > misses
                        else "disk" if new_hits > hits else "cold")
        return out
    return call


def backend(device_type: str, what: str = "inductor") -> str:
    """The generated code's kind on a device: C++ on the host, Triton on CUDA; the mode unless default."""
    mode = compile_mode()
    return f"{what}-{'triton' if device_type == 'cuda' else 'cpp'}" + ("" if mode == "default" else f":{mode}")


def why_unavailable(device_type: str) -> str | None:
    """Why Inductor cannot generate code for this device type here, or None."""
    if device_type == "cpu":
        found = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
        return None if found else "Inductor compiles C++ on the host and no C++ compiler (g++, c++, clang++) is here"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "Inductor generates Triton kernels on CUDA and triton does not import here"
    return None


def compiled_call(impl: str, label: str, body: Callable, *args, build_s: float = 0.0,
                  before: Callable[[], None] | None = None, **kwargs):
    """A PlannedCall of `body(*args, **kwargs)` compiled (torch.compile's mode from compile_mode()), its first run
    recorded in the call's `compiled`; `build_s` is what the plan spent building its operands beforehand; `before`,
    where given, runs eagerly inside every call, ahead of the compiled code."""
    mode = compile_mode()
    record = CompileRecord(mode=mode, build_s=build_s)
    fn = compiled(body, mode)

    def run():
        if before is not None:
            before()
        return fn(*args, **kwargs)
    return PlannedCall(impl, label, first_call_recorded(run, record), record)


class GraphWatch:
    """Dynamo's graph count from its making to `mark`'s call (the timer's hook before the checked call after the
    samples): the graphs a row compiled while it was sampled."""

    def __init__(self):
        self.counts = [graph_count()]

    def mark(self, then: Callable[[], None]) -> Callable[[], None]:
        def marked():
            self.counts.append(graph_count())
            then()
        return marked

    @property
    def recompiles(self) -> int:
        return self.counts[-1] - self.counts[0]
