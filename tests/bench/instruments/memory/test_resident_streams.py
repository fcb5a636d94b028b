"""Streams resident in a cache level: each call's passes move the bytes they count, and the passes follow the target
call duration."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from phasebench.bench.instruments.memory import resident_streams
from phasebench.bench.instruments.memory.resident_streams import SLIDE, LevelBuffers, level_passes

CPU = torch.device("cpu")


def drawn(buffers: LevelBuffers, seed: int) -> np.ndarray:
    """The source filled with drawn values (never a constant: a pass at the wrong offset would read the same)."""
    values = torch.rand(buffers.src.numel(), generator=torch.Generator().manual_seed(seed)) + 0.25
    buffers.src.copy_(values)
    return values.double().numpy()


@pytest.fixture
def one_thread():
    """The passes in turn (threads may take one part's passes side by side, in no set order)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("parts, passes", [(1, 1), (3, 5), (2, 7)])
def test_each_pass_of_a_resident_call_moves_the_bytes_it_counts(parts, passes, one_thread):
    """A sum reads every pass's whole source (it comes out `passes` times the source's sum, in float64); a fill and a
    copy write every pass's window of the target, each SLIDE floats past the last, so that what each part's target
    holds after a copy is what the passes in turn leave: the first SLIDE floats of the source at each earlier pass's
    start, the whole source at the last's. The bytes counted are the passes times the buffer (twice, for a copy)."""
    buffers = LevelBuffers(CPU, nbytes=4 * 3 * 10_007, parts=parts)  # 10_007 floats a part where parts is 3
    part = buffers.part
    assert part == 4 * 3 * 10_007 // 4 // parts and buffers.nbytes == 4 * parts * part
    src = drawn(buffers, seed=11 + parts)
    total, moved = buffers.call("sum", passes)
    assert moved == passes * buffers.nbytes and float(total()) == pytest.approx(passes * src.sum(), rel=1e-5)

    span = part + SLIDE * (passes - 1)
    fill, moved = buffers.call("fill", passes)
    buffers._dst.fill_(math.nan)  # poisoned: what no pass writes stays NaN
    assert moved == passes * buffers.nbytes and fill().numel() * 4 == moved
    assert bool((buffers._dst[:parts * span] == 1.0).all())

    copy, moved = buffers.call("copy", passes)
    buffers._dst.fill_(math.nan)
    assert moved == 2 * passes * buffers.nbytes
    copy()
    want = np.full(parts * span, np.nan)
    for j in range(parts):  # the passes in turn, in float64
        for i in range(passes):
            start = j * span + i * SLIDE
            want[start:start + part] = src[j * part:(j + 1) * part]
    np.testing.assert_array_equal(buffers._dst[:parts * span].double().numpy(), want)


def test_the_written_windows_grow_the_target_by_an_eighth_at_most():
    buffers = LevelBuffers(CPU, nbytes=4 * 2 * 40_961, parts=2)
    limit = buffers.max_passes
    assert SLIDE * (limit - 1) <= buffers.part / resident_streams.SPAN_SHARE < SLIDE * (limit + 1)
    buffers.call("copy", limit)
    with pytest.raises(ValueError, match=f"passes: must be 1 to {limit}"):
        buffers.call("fill", limit + 1)
    with pytest.raises(ValueError, match="passes: must be 1 to"):
        buffers.call("sum", 0)


class FakeKernel:
    """A call whose duration on a fake clock is a fixed dispatch plus a time per pass (no real timing)."""

    def __init__(self, dispatch_s: float, pass_s: float):
        self.now, self.dispatch_s, self.pass_s, self.asked = 0.0, dispatch_s, pass_s, []

    def clock(self) -> float:
        return self.now

    def call_of(self, passes: int):
        self.asked.append(passes)

        def call():
            self.now += self.dispatch_s + passes * self.pass_s
        return call


@pytest.mark.parametrize("target_s, pass_s, limit, want", [
    (1e-3, 7e-6, 10_000, 256),  # 128 passes take 0.898 ms, 256 take 1.794 ms: the first at the target or past it
    (2e-3, 7e-6, 10_000, 512),  # twice the target, twice the passes
    (1e-3, 3.5e-6, 10_000, 512),  # a level twice as fast, twice the passes
    (1e-3, 7e-6, 100, 100),  # the target's slide would outgrow the buffer: the limit
    (1e-3, 2e-3, 10_000, 1),  # one pass is already longer than the target
])
def test_the_passes_follow_the_target_call_duration(target_s, pass_s, limit, want):
    kernel = FakeKernel(dispatch_s=2e-6, pass_s=pass_s)
    passes, one = level_passes(kernel.call_of, limit, target_s=target_s, clock=kernel.clock)
    assert passes == want and one == pytest.approx(2e-6 + pass_s)
    doubled = [min(limit, 2 ** i) for i in range(len(kernel.asked))]
    assert kernel.asked == doubled and kernel.asked[-1] == want


def test_a_call_is_timed_at_its_least_of_repeats():
    """A neighbour stretches some calls, never shortens one: the least of the repeats is what the call takes."""
    times = iter([0.0, 5.0, 5.0, 9.0, 9.0, 9.5, 9.5, 12.0])  # the untimed call does not read the clock
    calls = []
    took = resident_streams.least_s(lambda: calls.append(1), 4, clock=lambda: next(times))
    assert took == 0.5 and len(calls) == 5
