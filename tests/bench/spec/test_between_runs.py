"""Intervals between runs from rounds: Student's t against its published quantiles, and, by simulation of runs whose
rounds move together with seeded draws, the coverage each interval promises (a repeat inside the repeat interval, two
runs of the same code outside the ratio interval) at about its level, and far from it for an interval of one run."""

from __future__ import annotations

import math
import random
import statistics

import pytest
from phasebench.bench.spec import between_runs as br


@pytest.mark.parametrize("df, q", [(1, 12.7062), (2, 4.3027), (3, 3.1824), (4, 2.7764), (9, 2.2622), (30, 2.0423),
                                   (200, 1.9719)])
def test_t_quantiles_match_the_table(df, q):
    assert br.t_quantile(0.975, df) == pytest.approx(q, abs=2e-4)
    assert br.t_quantile(0.025, df) == pytest.approx(-q, abs=2e-4)
    assert br.t_cdf(q, df) == pytest.approx(0.975, abs=1e-5)


def test_t_of_fractional_degrees_lies_between_its_neighbours_and_bad_input_is_refused():
    assert br.t_quantile(0.975, 2) > br.t_quantile(0.975, 2.5) > br.t_quantile(0.975, 3)
    assert br.t_cdf(0.0, 3.7) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="p: must be in"):
        br.t_quantile(1.0, 3)
    with pytest.raises(ValueError, match="df: must be positive"):
        br.t_cdf(1.0, 0)


def _run(rng: random.Random, rounds: int, shift: float = 0.0) -> list[float]:
    """The medians of one run's rounds: each round's process and moment move its median by a lognormal 8%, and a
    round's own sampling by 1%; `shift` moves the whole run (a real change)."""
    return [math.exp(math.log(2.0) + shift + rng.gauss(0, 0.08) + rng.gauss(0, 0.01)) for _ in range(rounds)]


def _figure(medians: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(m) for m in medians))


@pytest.mark.parametrize("rounds", [3, 5])
def test_a_repeat_lands_in_the_repeat_interval_about_as_often_as_its_level_says(rounds):
    rng = random.Random(52 + rounds)
    inside, trials = 0, 2000
    for _ in range(trials):
        first, second = _run(rng, rounds), _run(rng, rounds)
        low, high = br.repeat_interval(first, _figure(first))
        inside += low <= _figure(second) <= high
    assert 0.93 <= inside / trials <= 0.97  # binomial sd at 2000 trials: 0.5%
    # the interval of this run's mean (no sqrt(2)): a repeat falls outside it about twice as often as promised
    rng = random.Random(7)
    naive = 0
    for _ in range(trials):
        first, second = _run(rng, rounds), _run(rng, rounds)
        logs = [math.log(m) for m in first]
        half = br.t_quantile(0.975, rounds - 1) * statistics.stdev(logs) / math.sqrt(rounds)
        naive += abs(math.log(_figure(second)) - statistics.fmean(logs)) <= half
    assert naive / trials < 0.92


def test_two_runs_of_the_same_code_are_told_apart_at_the_promised_rate_and_a_real_change_is_found():
    rng = random.Random(3)
    alarms, found, trials = 0, 0, 2000
    for _ in range(trials):
        base, new = _run(rng, 3), _run(rng, 3)
        low, high, df = br.ratio_between_runs(new, base, _figure(new) / _figure(base))
        alarms += not (low <= 1 <= high)
        assert 2 <= df <= 4 + 1e-9
        slower = _run(rng, 3, shift=math.log(1.5))
        low, _, _ = br.ratio_between_runs(slower, base, _figure(slower) / _figure(base))
        found += low > 1
    assert alarms / trials <= 0.06  # Welch's interval is at most a little conservative: <= 5% plus sampling
    assert found / trials > 0.8


def test_paired_rounds_take_out_what_moves_both_impls_alike():
    """Two impls measured in the same rounds: a round's moment moves both; the paired interval of the ratio is far
    narrower than one that treats the rounds as independent runs, and holds the true ratio 0.8."""
    rng = random.Random(11)
    moments = [rng.gauss(0, 0.1) for _ in range(5)]
    base = [2.0 * math.exp(m + rng.gauss(0, 0.01)) for m in moments]
    new = [1.6 * math.exp(m + rng.gauss(0, 0.01)) for m in moments]
    ratio = _figure(new) / _figure(base)
    paired = br.paired_ratio(new, base, ratio)
    welch = br.ratio_between_runs(new, base, ratio)
    assert paired[0] <= 0.8 <= paired[1] and paired[1] - paired[0] < (welch[1] - welch[0]) / 4
    assert all(math.isnan(v) for v in br.paired_ratio(new[:3], base, ratio))


def test_under_two_rounds_there_is_no_interval_and_rounds_that_tie_keep_a_width():
    """Rounds whose medians tie (a timer's resolution on a kernel of microseconds) would give an interval of no width
    and a verdict of full confidence on a 14% ratio; their spread is taken as at least S_FLOOR."""
    assert all(math.isnan(v) for v in br.repeat_interval([2.0], 2.0))
    assert all(math.isnan(v) for v in br.ratio_between_runs([1.0], [1.0, 1.1], 1.0))
    assert all(math.isnan(v) for v in br.repeat_interval([2.0, -1.0], 2.0))
    low, high, df = br.ratio_between_runs([4.096e-3] * 3, [3.584e-3] * 3, 4.096 / 3.584)
    assert low < 4.096 / 3.584 < high and high / low > 1.003 and math.isfinite(df)
    low, high = br.repeat_interval([2.0, 2.0, 2.0], 2.0)
    assert 2.0 * math.exp(-0.01) < low < 2.0 < high < 2.0 * math.exp(0.01)


def test_round_medians_survive_a_csv_cell():
    text = br.latencies_text([2.2134567, 0.0001234567, 1500.0])
    assert text == "2.21346/0.000123457/1500"
    assert br.latencies_of(text) == pytest.approx([2.21346, 0.000123457, 1500.0])
    assert br.latencies_of("") == [] and br.latencies_of(float("nan")) == [] and br.latencies_of(None) == []
    assert br.latencies_of([1, 2]) == [1.0, 2.0]


def test_rounds_pair_only_where_both_ran_in_their_turn():
    """Round 2 missing from one impl and round 3 measured again at the end for the other: only round 1 and 4 pair."""
    new = br.latencies_text([1.0, None, 1.2, 1.3])
    base = br.latencies_text([2.0, 2.1, 2.2, 2.3], [False, False, True, False])
    assert (new, base) == ("1//1.2/1.3", "2/2.1/2.2r/2.3")
    assert br.round_slots(base)[2] == (2.2, True) and br.round_slots(new)[1] is None
    assert br.paired_rounds(new, base) == ([1.0, 1.3], [2.0, 2.3])
    assert br.latencies_of(base) == [2.0, 2.1, 2.2, 2.3]
    assert br.run_figure([1.0, 4.0]) == pytest.approx(2.0) and math.isnan(br.run_figure([]))


def test_rounds_of_a_kernel_of_microseconds_keep_the_timers_step_as_their_spread():
    """A 4 us GPU kernel whose rounds tie on CUDA events' steps: its interval is at least a microsecond's worth (25%),
    so a one-step move between runs is never a verdict; a kernel of milliseconds keeps the 0.1% floor."""
    low, high, _ = br.ratio_between_runs([4.5e-3] * 3, [4.0e-3] * 3, 4.5 / 4.0)
    assert low < 1.0 < high
    low, high = br.repeat_interval([2.0] * 3, 2.0)
    assert high / low < 1.05
