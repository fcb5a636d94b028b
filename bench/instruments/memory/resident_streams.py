"""Streams resident in a host cache level: one call makes many passes over a buffer sized to the level, the passes
set from a target call duration, and the dispatch a call pays measured beside it."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

ELEMENT = 4  # the streams run on float32 buffers
# What each stream runs in a cache level: kernels that make every pass inside one call. A read is a sum over a view
# that repeats the buffer (stride 0); BLAS's dot and GEMV take no such view (a GEMV's leading dimension must cover a
# row, and a batch of stride 0 ran torch.bmm's slow loop, 16x slower a pass than one GEMV).
LEVEL_KERNELS = {"read": ("sum",), "write": ("fill",), "copy": ("copy",)}
SLIDE = 16  # floats (one 64-byte line) by which each written pass's window starts past the previous one's
SPAN_SHARE = 8  # the passes stop where the slide would grow a part of the target by more than 1/SPAN_SHARE of it
LEVEL_CALL_S = 1e-3  # the passes double until one call takes this long (the least of PASS_REPEATS calls)
PASS_REPEATS = 3
EMPTY_FLOATS = 16  # the near-empty call: the same kernel over this many floats, to show what a call pays to dispatch
EMPTY_REPEATS = 50


class LevelBuffers:
    """A float32 source of about `nbytes` and its target, split in `parts` (default: torch's threads, so that each
    thread streams a part of its own and no two cores write one line); `call(kernel, passes)` is (one call that makes
    `passes` passes over the source (sum), the target (fill) or both (copy), the bytes it moves).

    A pass re-reads the source through a view that repeats it (stride 0); a written pass writes a window of the
    target that starts SLIDE floats past the previous pass's (a copy refuses a target that repeats), so each pass
    writes every byte it counts. The target spans SLIDE·(passes - 1) floats more than the source per part, at most
    1/SPAN_SHARE of it (max_passes)."""

    def __init__(self, device: torch.device, nbytes: int, parts: int | None = None):
        self.parts = max(1, parts or torch.get_num_threads())
        self.part = max(1, nbytes // ELEMENT // self.parts)
        self.src = torch.full((self.parts * self.part,), 0.5, device=device)
        self._dst = torch.zeros_like(self.src)  # written once here, and again when grown: no timed first touch

    @property
    def nbytes(self) -> int:
        return self.src.numel() * ELEMENT

    @property
    def max_passes(self) -> int:
        return max(1, self.part // (SLIDE * SPAN_SHARE))

    def source(self, passes: int) -> torch.Tensor:
        return self.src.as_strided((self.parts, passes, self.part), (self.part, 0, 1))

    def target(self, passes: int) -> torch.Tensor:
        span = self.part + SLIDE * (passes - 1)
        if self._dst.numel() < self.parts * span:
            self._dst = torch.zeros(self.parts * span, device=self.src.device)
        return self._dst.as_strided((self.parts, passes, self.part), (span, SLIDE, 1))

    def call(self, kernel: str, passes: int = 1):
        if not 1 <= passes <= self.max_passes:
            raise ValueError(f"passes: must be 1 to {self.max_passes} for parts of {self.part} floats, got {passes}")
        src, dst = self.source(passes), self.target(passes)
        moved = passes * self.nbytes
        calls = {"sum": (lambda: src.sum(), moved), "fill": (lambda: dst.fill_(1.0), moved),
                 "copy": (lambda: dst.copy_(src), 2 * moved)}
        return calls[kernel]


def least_s(fn: Callable[[], object], repeats: int, clock: Callable[[], float] = time.perf_counter) -> float:
    """The least seconds of `repeats` calls of fn (after one untimed): what the call takes when nothing interrupts."""
    fn()
    best = math.inf
    for _ in range(repeats):
        start = clock()
        fn()
        best = min(best, clock() - start)
    return best


def level_passes(call_of: Callable[[int], Callable[[], object]], limit: int, target_s: float = LEVEL_CALL_S,
                 clock: Callable[[], float] = time.perf_counter) -> tuple[int, float]:
    """(passes, seconds of a one-pass call): the passes double from one while the least of PASS_REPEATS calls of
    `call_of(passes)` takes under target_s, up to `limit`; a call then takes target_s to twice that."""
    passes, one = 1, None
    while True:
        took = least_s(call_of(passes), PASS_REPEATS, clock)
        one = took if one is None else one
        if took >= target_s or passes >= limit:
            return passes, one
        passes = min(limit, 2 * passes)


def empty_call_s(kernel: str, device: torch.device, clock: Callable[[], float] = time.perf_counter) -> float:
    """The least seconds of `kernel` over EMPTY_FLOATS floats in one part: a call's dispatch, with nothing to move."""
    fn, _ = LevelBuffers(device, EMPTY_FLOATS * ELEMENT, parts=1).call(kernel)
    return least_s(fn, EMPTY_REPEATS, clock)
