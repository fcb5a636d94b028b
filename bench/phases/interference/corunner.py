"""The prefill co-located with a timed decode step: looped in a second process (host or GPU) or on a second CUDA
stream of this process, the spans of its iterations on one clock, and the pinning of a process's threads to cores."""

from __future__ import annotations

import math
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ...instruments.roofline import TORCH_DTYPES
from ...spec.models import DecoderConfig
from ...sweep.measure import one_line

Span = tuple[float, float]  # time.monotonic() at an iteration's start and end: CLOCK_MONOTONIC, one for all processes
READY_TIMEOUT_S = 900.0  # spawning, importing torch, a CUDA context and the model's weights
REPLY_TIMEOUT_S = 600.0  # one command: the longest prefill, or a loop's last iteration after the stop
HIGHEST_PRIORITY, LOWEST_PRIORITY = -100, 0  # torch maps a priority outside the device's range to its nearest end


class CoRunnerError(RuntimeError):
    """The co-runner failed or died; the message is one line."""


@dataclass(frozen=True)
class Placement:
    """Where one side runs: on the host its CPUs and torch threads (None: all allowed, as many threads as CPUs);
    on a GPU its stream's priority (lower is higher; None: a stream of default priority)."""

    cpus: frozenset[int] | None = None
    threads: int | None = None
    priority: int | None = None

    def describe(self) -> str:
        if self.priority is not None:
            return f"stream priority {self.priority}"
        if self.cpus is None:
            return f"cpus all (unpinned), {self.threads} threads" if self.threads is not None else ""
        return f"cpus {cpu_list(self.cpus)}, {self.threads} threads"


@dataclass(frozen=True)
class PrefillSpec:
    """What the co-runner builds: a reference decoder of `layers` layers for prompts up to max_prompt tokens."""

    model: DecoderConfig
    layers: int
    device: str
    dtype: str
    max_prompt: int
    seed: int = 1


def cpu_list(cpus) -> str:
    return ",".join(map(str, sorted(cpus))) if cpus is not None else "all"


def allowed_cpus() -> frozenset[int]:
    return frozenset(os.sched_getaffinity(0))


def split_cpus(cpus, decode_share: float = 0.5) -> tuple[frozenset[int], frozenset[int]] | None:
    """Disjoint CPU sets for the decode (the first `decode_share` of them, at least one) and the prefill (the
    rest, at least one); None with fewer than 2 CPUs."""
    ordered = sorted(cpus)
    if len(ordered) < 2:
        return None
    n = min(len(ordered) - 1, max(1, round(len(ordered) * decode_share)))
    return frozenset(ordered[:n]), frozenset(ordered[n:])


def pin_threads(cpus) -> None:
    """Every thread of this process on `cpus` (os.sched_setaffinity on one tid moves that thread only, and
    OpenMP's pool exists already); threads made later inherit the main thread's set."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (OSError, ValueError):  # a thread that ended meanwhile
            continue


def place_host(placement: Placement, every: frozenset[int]) -> None:
    """This process's threads and torch's thread count as `placement` says (all of `every` by default)."""
    cpus = placement.cpus if placement.cpus is not None else every
    pin_threads(cpus)
    torch.set_num_threads(placement.threads or len(cpus))


def build_decoder(spec: PrefillSpec):
    from ..reference_decoder import ReferenceDecoder

    decoder = ReferenceDecoder(spec.model, spec.layers, spec.device, TORCH_DTYPES[spec.dtype],
                               max_tokens=spec.max_prompt, max_batch=1, seed=spec.seed)
    decoder.prefill(1, min(spec.max_prompt, 16))  # fills the cache, allocates, loads the kernels
    if decoder.device.type == "cuda":
        torch.cuda.synchronize(decoder.device)  # done on the default stream before another stream reads it
    return decoder


def loop_prefill(decoder, prompt: int, keep_going: Callable[[list[Span]], bool], sync: Callable[[], None],
                 on_done: Callable[[Span], None] | None = None) -> list[Span]:
    """Prefill one prompt of `prompt` tokens again and again, each iteration finished (`sync`) before the next,
    while keep_going(spans so far) holds (at least once); on_done gets each iteration's span."""
    spans: list[Span] = []
    while True:
        start = time.monotonic()
        decoder.prefill(1, prompt)
        sync()
        spans.append((start, time.monotonic()))
        if on_done is not None:
            on_done(spans[-1])
        if not keep_going(spans):
            return spans


def covered_share(spans: list[Span], start: float, end: float) -> float:
    """The share (0..1) of the window [start, end] that the iterations' spans cover: their union, so that gaps
    between iterations (a co-runner that stalled, started late or died early) count as uncovered and overlaps
    count once. NaN for an empty window."""
    if not end > start:
        return math.nan
    covered, reach = 0.0, start
    for a, b in sorted(spans):
        a, b = max(a, reach), min(b, end)
        if b > a:
            covered += b - a
            reach = b
    return covered / (end - start)


def for_seconds(seconds: float, min_iterations: int) -> Callable[[list[Span]], bool]:
    """keep_going for a prefill timed alone: until `seconds` have passed and `min_iterations` ran."""
    deadline = time.monotonic() + seconds
    return lambda spans: len(spans) < min_iterations or time.monotonic() < deadline


# ---- a second process ------------------------------------------------------------------------------------------


def _serve(conn, stop, latest, spec: PrefillSpec) -> None:
    """The co-runner process: build the decoder, then answer commands until 'close'."""
    try:
        device = torch.device(spec.device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        decoder = build_decoder(spec)
        sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
        every = allowed_cpus()
        conn.send(("ready", os.getpid()))
    except BaseException as err:
        conn.send(("error", one_line(err)))
        return

    def done(span):
        latest.value = span[0]

    while True:
        command = conn.recv()
        try:
            if command[0] == "close":
                return
            _, prompt, placement, seconds, min_iterations = command
            if device.type == "cpu":
                place_host(placement, every)
            if command[0] == "alone":
                spans = loop_prefill(decoder, prompt, for_seconds(seconds, min_iterations), sync)
                conn.send(("spans", spans, spans[0][0]))
            else:
                begun = time.monotonic()  # the loop runs from here: its iterations follow each other with no gap
                conn.send(("started",))
                spans = loop_prefill(decoder, prompt, lambda _: not stop.is_set(), sync, on_done=done)
                conn.send(("spans", spans, begun))
        except BaseException as err:
            conn.send(("error", one_line(err)))


class ProcessCoRunner:
    """The prefill in a process of its own (spawned: a fresh interpreter with its own threads, or its own CUDA
    context), driven through a pipe; its iterations are timed there, on the clock every process shares. As with any
    spawned process, a script that makes one needs the `if __name__ == "__main__":` guard."""

    mechanism = "process"

    def __init__(self, spec: PrefillSpec):
        """Start the process; it builds its decoder while the caller goes on (wait_ready() waits for it)."""
        context = multiprocessing.get_context("spawn")  # a fork would inherit OpenMP's pool and a CUDA context
        self._conn, child = context.Pipe()
        self._stop = context.Event()
        self._latest = context.Value("d", -math.inf)
        self._process = context.Process(target=_serve, args=(child, self._stop, self._latest, spec), daemon=True,
                                        name="phasebench-prefill")
        self._process.start()
        child.close()
        self.pid: int | None = None

    def wait_ready(self) -> None:
        _, self.pid = self._reply("ready", READY_TIMEOUT_S)

    def _reply(self, kind: str, timeout: float) -> tuple:
        deadline = time.monotonic() + timeout
        while not self._conn.poll(0.2):
            if not self._process.is_alive():
                raise CoRunnerError(f"the prefill process died (exit code {self._process.exitcode})")
            if time.monotonic() > deadline:
                raise CoRunnerError(f"the prefill process did not answer within {timeout:g} s")
        try:
            message = self._conn.recv()
        except EOFError:
            raise CoRunnerError("the prefill process closed its pipe") from None
        if message[0] == "error":
            raise CoRunnerError(f"prefill process: {message[1]}")
        if message[0] != kind:
            raise CoRunnerError(f"prefill process: expected {kind!r}, got {message[0]!r}")
        return message

    def alone(self, prompt: int, placement: Placement, seconds: float, min_iterations: int = 2) -> list[Span]:
        self._conn.send(("alone", prompt, placement, seconds, min_iterations))
        return self._reply("spans", REPLY_TIMEOUT_S + seconds)[1]

    def start(self, prompt: int, placement: Placement) -> None:
        """Loop the prefill until stop(); returns once its first iteration is under way."""
        self._stop.clear()
        self._latest.value = -math.inf
        self._conn.send(("loop", prompt, placement, 0.0, 1))
        self._reply("started", REPLY_TIMEOUT_S)

    def latest_done_start(self) -> float:
        """The start of the latest iteration that has finished (-inf: none yet)."""
        return self._latest.value

    def stop(self) -> tuple[list[Span], float]:
        """The loop's iterations, and when it began (just before the first one)."""
        self._stop.set()
        _, spans, begun = self._reply("spans", REPLY_TIMEOUT_S)
        return spans, begun

    def close(self) -> None:
        """Ask the process to end, and end it (SIGTERM, then SIGKILL) if it has not within a second or two."""
        if self._process.is_alive():
            try:
                self._conn.send(("close",))
                self._process.join(2)
            except OSError:
                pass
        for end in (self._process.terminate, self._process.kill):
            if self._process.is_alive():
                end()
                self._process.join(2)


# ---- a second CUDA stream of this process ----------------------------------------------------------------------


class StreamCoRunner:
    """The prefill on a CUDA stream of its own in this process (its own copy of the weights, a thread that launches
    it), so that the GPU runs its kernels beside the decode's; a priority per stream."""

    mechanism = "stream"
    pid = None  # in this process: its CPU time is ours

    def __init__(self, spec: PrefillSpec):
        self.device = torch.device(spec.device)
        self._streams: dict[int, torch.cuda.Stream] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._latest = self._begun = -math.inf
        self._result: list[Span] | BaseException = []
        self.decoder = build_decoder(spec)

    def wait_ready(self) -> None:
        """Built in __init__ already: alone(), start() and the rest work without this call."""

    def stream(self, priority: int | None) -> torch.cuda.Stream:
        key = LOWEST_PRIORITY if priority is None else priority
        if key not in self._streams:
            self._streams[key] = torch.cuda.Stream(self.device, priority=key)
        return self._streams[key]

    def alone(self, prompt: int, placement: Placement, seconds: float, min_iterations: int = 2) -> list[Span]:
        stream = self.stream(placement.priority)
        with torch.cuda.stream(stream):
            return loop_prefill(self.decoder, prompt, for_seconds(seconds, min_iterations), stream.synchronize)

    def _run(self, prompt: int, stream: torch.cuda.Stream, started: threading.Event) -> None:
        def done(span):
            self._latest = span[0]

        try:
            torch.cuda.set_device(self.device)
            with torch.cuda.stream(stream):  # the current stream is per thread
                self._begun = time.monotonic()
                started.set()
                self._result = loop_prefill(self.decoder, prompt, lambda _: not self._stop.is_set(),
                                            stream.synchronize, on_done=done)
        except BaseException as err:
            self._result = err
        finally:
            started.set()

    def start(self, prompt: int, placement: Placement) -> None:
        self._stop.clear()
        self._latest, self._result = -math.inf, []
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(prompt, self.stream(placement.priority), started),
                                        name="phasebench-prefill", daemon=True)
        self._thread.start()
        started.wait()

    def latest_done_start(self) -> float:
        return self._latest

    def stop(self) -> tuple[list[Span], float]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if isinstance(self._result, BaseException):
            raise CoRunnerError(f"prefill stream: {one_line(self._result)}")
        return self._result, self._begun

    def close(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self.stop()
