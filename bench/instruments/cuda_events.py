"""CUDA events around timed calls, a batch at a time, with an L2 flush between calls that reads a buffer larger than
the L2 (bench.instruments.timing times with them)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...profiles.names import L2FLUSH
from ...profiles.nvtx_ranges import nvtx_range


def l2_flush_buffer(device: torch.device) -> torch.Tensor:
    """A buffer several times the L2 cache; reading it (flush_l2) evicts what the previous call left there."""
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 64 << 20
    return torch.empty(max(4 * l2, 256 << 20) // 4, dtype=torch.int32, device=device)


def flush_l2(buffer) -> None:
    """Evict the L2 by reading `buffer` (l2_flush_buffer) in one reduction whose result is dropped: nothing of it is
    written, so the lines it leaves are clean and the timed call pays no write-back of the flush's own (zeroing the
    buffer left L2 full of dirty lines)."""
    buffer.amax()


class EventBatches:
    """Timed calls on a GPU, a batch at a time: the L2 flush (outside the events) and events around each call, then
    one wait for the batch; `next` counts the calls taken (the checked call after the samples is the next in turn).
    `event` makes a timing event (a fake one in the host's tests)."""

    def __init__(self, runs, flush, sync: Callable[[], None],
                 event: Callable[[], object] = lambda: torch.cuda.Event(enable_timing=True)):
        self.runs, self.flush, self.sync, self.event = runs, flush, sync, event
        self.next = 0

    def __call__(self, k: int) -> list[float]:
        starts, ends = [self.event() for _ in range(k)], [self.event() for _ in range(k)]
        for start, end in zip(starts, ends, strict=True):
            if self.flush is not None:
                with nvtx_range(L2FLUSH):
                    flush_l2(self.flush)
            at = self.next % len(self.runs)
            self.next += 1
            start.record()
            self.runs[at]()
            end.record()
        self.sync()
        return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
