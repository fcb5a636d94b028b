"""The interval of a median (no torch): the order-statistic ranks against exact binomial sums, the interval on known
samples, the halves and why sampling stopped, outliers by Tukey's fences, a ratio's interval and overlap."""

from __future__ import annotations

import math
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest
from phasebench.bench.spec import interval
from phasebench.bench.spec.interval import (
    MedianInterval,
    half_intervals,
    halves_agree,
    interval_columns,
    median_interval,
    median_ranks,
    medians_agree,
    outlier_count,
    overlap,
    rank_coverage,
    ratio_interval,
    stop_reason_of,
)


def exact_ranks(n: int, confidence: float) -> tuple[int, int] | None:
    """The textbook rule in exact fractions: the largest l whose two tails each hold at most (1 - confidence) / 2."""
    tail, best, below = Fraction(1 - Fraction(confidence)) / 2, 0, Fraction(0)
    for low in range(1, n // 2 + 2):
        below += Fraction(math.comb(n, low - 1), 2 ** n)  # P(B <= low - 1)
        if below > tail:
            break
        best = low
    return (best, n + 1 - best) if best else None


@pytest.mark.parametrize("n", [1, 2, 5, 6, 7, 8, 9, 13, 17, 20, 31, 97, 100, 101, 257, 1025])
@pytest.mark.parametrize("confidence", [0.95, 0.99, 0.9])
def test_ranks_are_the_exact_binomial_ones(n, confidence):
    assert median_ranks(n, confidence) == exact_ranks(n, Fraction(confidence))


def test_the_known_table_values_and_the_smallest_count_with_a_95_interval():
    assert median_ranks(5) is None and median_ranks(6) == (1, 6)  # [min, max] of 5 covers 93.75% only
    assert median_ranks(20) == (6, 15) and median_ranks(100) == (40, 61)  # the published table values
    assert rank_coverage(6, 1) == pytest.approx(1 - 2 / 64) and rank_coverage(100, 40) >= 0.95


def test_the_log_space_tail_of_large_counts_agrees_with_exact_integers():
    n = interval._EXACT_UP_TO + 7  # past the exact path
    got = median_ranks(n)
    assert got == exact_ranks(n, Fraction(0.95))
    assert rank_coverage(n, got[0]) == pytest.approx(float(1 - 2 * sum(Fraction(math.comb(n, k), 2 ** n)
                                                                       for k in range(got[0]))), rel=1e-9)


def test_the_interval_of_known_samples_is_the_pair_of_order_statistics():
    rng = np.random.default_rng(43)
    samples = rng.lognormal(0.0, 0.3, size=97)
    found = median_interval(samples)
    ordered = np.sort(samples)
    low, high = median_ranks(97)
    assert (found.low, found.high, found.count) == (ordered[low - 1], ordered[high - 1], 97)
    assert found.median == np.median(samples) and found.low <= found.median <= found.high
    assert found.rel_half_width == pytest.approx((found.high - found.low) / 2 / found.median)
    assert found.coverage >= 0.95


def test_too_few_samples_have_no_interval_and_never_converge():
    found = median_interval([3.0, 1.0, 2.0, 5.0, 4.0])
    assert found.median == 3.0 and math.isnan(found.low) and math.isnan(found.rel_half_width)
    assert not found.converged(0.5)
    assert math.isnan(median_interval([]).median)


def test_converged_follows_the_target():
    found = median_interval([10.0, 10.1, 9.9, 10.05, 9.95, 10.02, 9.98])  # 7 samples: [min, max]
    assert found.rel_half_width == pytest.approx(0.01)
    assert found.converged(0.0101) and not found.converged(0.0099) and not found.converged(0.0)


def test_bad_counts_and_confidences_get_one_line():
    with pytest.raises(ValueError, match="n: must be a count"):
        median_ranks(-1)
    with pytest.raises(ValueError, match=r"confidence: must be in \(0, 1\)"):
        median_ranks(10, 1.0)


def test_outliers_are_counted_beyond_the_fences_and_kept():
    samples = [10.0, 10.2, 9.9, 10.1, 10.0, 10.3, 9.8, 25.0, 10.1, 1.0, 10.2]
    q1, q3 = np.percentile(samples, [25, 75])
    expected = sum(1 for s in samples if s < q1 - 1.5 * (q3 - q1) or s > q3 + 1.5 * (q3 - q1))
    assert outlier_count(samples) == expected == 2
    assert outlier_count([1.0, 100.0, 1e4]) == 0  # under 4 samples no quartiles to fence with
    columns = interval_columns(samples, 0.5)
    assert columns["outliers"] == 2 and columns["latency_ci_low_ms"] <= np.median(samples)  # kept, not removed
    assert set(columns) == set(interval.INTERVAL_COLUMNS)


def test_the_halves_split_the_samples_in_time_order_and_disagree_only_where_their_intervals_are_disjoint():
    rng = np.random.default_rng(29)
    early, late = list(rng.normal(1.0, 0.01, 20)), list(rng.normal(1.3, 0.01, 21))
    first, second = half_intervals(early + late)
    assert (first.count, second.count) == (20, 21)  # the middle sample of an odd count goes to the second half
    assert first.median == np.median(early) and second.median == np.median(late)
    assert not halves_agree(first, second) and stop_reason_of(early + late, 0.5, "time limit") == "drifting"
    mixed = list(rng.permutation(early + late))
    assert halves_agree(*half_intervals(mixed))
    assert stop_reason_of(mixed, 0.5, "time limit") == "target"  # wide as it is, a target of ±50% holds it
    assert stop_reason_of(mixed, 0.001, "sample limit") == "sample limit"
    assert stop_reason_of(mixed, 0.0, "fixed count") == "fixed count"  # no target: never met
    few = [1.0, 1.1, 0.9, 2.0, 2.1, 1.9, 2.2]  # halves of 3 and 4: no interval, and 2 / C(7, 3) = 5.7% by chance
    assert halves_agree(*half_intervals(few)) and stop_reason_of(few, 0.0, "fixed count") == "fixed count"


def test_halves_too_small_for_intervals_disagree_where_every_sample_of_one_lies_beyond_the_other():
    """A slow call stops at 8-11 samples: its halves have no interval, but complete separation of 4 and 4 happens by
    chance with 2 / 70 = 2.9%: a 20% step between them is drifting, a mixed order is not."""
    rng = np.random.default_rng(52)
    step = list(rng.normal(25.0, 0.2, 4)) + list(rng.normal(30.0, 0.2, 5))
    assert stop_reason_of(step, 0.02, "time limit") == "drifting"
    slowing = list(rng.normal(30.0, 0.2, 4)) + list(rng.normal(25.0, 0.2, 5))  # slower first, then faster
    assert stop_reason_of(slowing, 0.02, "time limit") == "drifting"
    mixed = [25.1, 30.2, 24.9, 29.8, 25.0, 30.1, 24.8, 29.9, 25.2]
    assert stop_reason_of(mixed, 0.02, "time limit") == "time limit"
    six = [25.0, 25.1, 24.9, 30.0, 30.1, 29.9]  # 2 / C(6, 3) = 10%: no verdict at six samples
    assert stop_reason_of(six, 0.02, "time limit") == "time limit"


def test_medians_agree_only_where_each_lies_inside_the_other_interval():
    a = MedianInterval(10.0, 9.0, 11.0, 30, 0.95)
    assert medians_agree(a, MedianInterval(10.5, 9.8, 11.2, 30, 0.95))
    assert not medians_agree(a, MedianInterval(11.2, 9.9, 12.0, 30, 0.95))  # overlapping, its median outside a's
    assert not medians_agree(a, MedianInterval(10.9, 10.4, 11.4, 30, 0.95))  # a's median outside its interval
    assert not medians_agree(a, MedianInterval(10.0, math.nan, math.nan, 5, math.nan))  # no interval: not shown


def test_the_columns_say_why_sampling_stopped_and_carry_the_halves():
    rng = np.random.default_rng(31)
    samples = list(rng.normal(2.0, 0.02, 30)) + list(rng.normal(2.5, 0.02, 31))
    columns = interval_columns(samples, 0.5, warmup_s=0.31)
    assert columns["stop_reason"] == "drifting" and columns["drifting"] and not columns["converged"]
    assert columns["first_half_ms"] == np.median(samples[:30]) and columns["second_half_ms"] == np.median(samples[30:])
    assert columns["warmup_s"] == 0.31 and math.isnan(interval_columns(samples, 0.5)["warmup_s"])
    given = interval_columns(samples, 0.5, stop="time limit")  # the sampler's own reason is kept as it says
    assert given["stop_reason"] == "time limit" and not given["drifting"] and not given["converged"]
    with pytest.raises(ValueError, match="stop: must be one of target, time limit"):
        interval_columns(samples, 0.5, stop="converged")


def test_a_ratio_interval_adds_the_log_arms_in_quadrature():
    new, base = (12.0, 11.0, 13.5), (10.0, 9.5, 10.4)
    ratio, low, high = ratio_interval(new, base)
    assert ratio == pytest.approx(1.2)
    assert low == pytest.approx(1.2 * math.exp(-math.hypot(math.log(12 / 11), math.log(10.4 / 10))))
    assert high == pytest.approx(1.2 * math.exp(math.hypot(math.log(13.5 / 12), math.log(10 / 9.5))))
    swapped = ratio_interval(base, new)
    assert swapped[1] == pytest.approx(1 / high) and swapped[2] == pytest.approx(1 / low)  # symmetric in log space
    assert all(math.isnan(x) for x in ratio_interval((12.0, math.nan, math.nan), base)[1:])


def test_overlap_of_intervals():
    assert overlap((1.0, 2.0), (2.0, 3.0)) and overlap((1.0, 5.0), (2.0, 3.0))
    assert not overlap((1.0, 1.9), (2.0, 3.0)) and not overlap((2.0, 3.0), (1.0, 1.9))
    assert overlap((1.0, math.nan), (5.0, 6.0))  # unknown: never a separation


def test_the_interval_module_imports_no_torch():
    code = "import sys, phasebench.bench.spec.interval; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
