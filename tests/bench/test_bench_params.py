"""The pytest-benchmark suite's sampler: the rounds take the calls in turn and poison what an in-place op writes
before the last one, whose output is judged."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from phasebench.bench.bench_params import BenchmarkSampler


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
def test_the_last_round_follows_before_last_and_its_output_is_kept(disabled, interpreter):
    log = []
    calls = [lambda i=i: log.append(("call", i)) or len(log) for i in range(3)]
    sampler = BenchmarkSampler(Rounds(disabled), torch.device("cpu"), cold=False)
    timing = sampler(calls, torch.device("cpu"), range_name="test", payload=0.0, interpreter=interpreter,
                     before_last=lambda: log.append(("last",)))
    assert log.count(("last",)) == 1 and log[-2][0] == "last" and log[-1][0] == "call"
    rounds = 0 if disabled else (1 if interpreter else timing.count)  # the interpreter's one round, else 6+
    assert timing.last == len(log) and timing.count == rounds and (interpreter or disabled or rounds >= 6)
    if interpreter and not disabled:  # one call after the gate's: no warm-up round
        assert len(made_calls(log)) == 1
    made = made_calls(log)
    assert made == [i % 3 for i in range(len(made))]  # in turn, the warm-up round first
