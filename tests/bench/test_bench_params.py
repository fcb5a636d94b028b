"""The pytest-benchmark suite's sampler: the rounds take the calls in turn; after them the checked call, the next in
turn, untimed, with what an in-place op writes poisoned before it and its allocations under the guard."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch
from phasebench.bench.bench_params import BenchmarkSampler
from phasebench.bench.sweep.measure import INTERPRETER_SAMPLES


class Rounds:
    """pytest-benchmark's fixture as far as the sampler uses it: pedantic runs setup before each round, the warm-up
    rounds first (pytest_benchmark.fixture._raw_pedantic), or a single call when disabled."""

    def __init__(self, disabled: bool):
        self.disabled, self.stats = disabled, SimpleNamespace(stats=SimpleNamespace(data=[]))

    def pedantic(self, target, setup, rounds, warmup_rounds, iterations):
        for i in range(1 if self.disabled else warmup_rounds + rounds):
            args, kwargs = setup()
            target(*args, **kwargs)
            if not self.disabled and i >= warmup_rounds:
                self.stats.stats.data.append(1e-3)


def made_calls(log) -> list[int]:
    return [e[1] for e in log if e[0] == "call"]


@pytest.mark.parametrize("interpreter", [True, False])
@pytest.mark.parametrize("disabled", [False, True])
def test_the_checked_call_follows_the_rounds_before_last_and_the_guard(disabled, interpreter):
    log = []
    calls = [lambda i=i: log.append(("call", i)) or len(log) for i in range(3)]

    def guard():
        log.append(("guard",))
        return contextlib.nullcontext()

    sampler = BenchmarkSampler(Rounds(disabled), torch.device("cpu"), cold=False)
    timing = sampler(calls, torch.device("cpu"), range_name="test", payload=0.0, interpreter=interpreter,
                     before_last=lambda: log.append(("last",)), guard_last=guard)
    assert log.count(("last",)) == log.count(("guard",)) == 1 and log[-3][0] == "last" and log[-1][0] == "call"
    rounds = 0 if disabled else (INTERPRETER_SAMPLES if interpreter else timing.count)  # the interpreter's one, else 6+
    assert timing.last == len(log) and timing.count == rounds and (interpreter or disabled or rounds >= 6)
    if interpreter and not disabled:  # one call after the gate's (no warm-up round), then the checked call
        assert len(made_calls(log)) == INTERPRETER_SAMPLES + 1
    made = made_calls(log)
    assert made == [i % 3 for i in range(len(made))]  # in turn, the warm-up round first
