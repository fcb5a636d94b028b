"""The uncertainty of a median: its distribution-free confidence interval from order statistics, whether the halves
of the samples agree, the outliers beyond Tukey's fences (counted, never removed), and the interval of a ratio of two
medians (no torch)."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

CONFIDENCE = 0.95
FENCE = 1.5  # an outlier lies beyond Q1 - 1.5 IQR or Q3 + 1.5 IQR (Tukey's fences, as tritonbench filters)
_EXACT_UP_TO = 2048  # binomial tails in exact integers up to this many samples, in log space beyond
INTERVAL_COLUMNS = ("latency_ci_low_ms", "latency_ci_high_ms", "latency_ci_rel", "converged", "outliers",
                    "stop_reason", "drifting", "first_half_ms", "second_half_ms", "warmup_s")
# Why sampling stopped: its target met with halves that agree; a limit; a limit reached with halves that disagree;
# a count fixed in advance (no target, or a timer that takes a set number of rounds)
TARGET, TIME_LIMIT, SAMPLE_LIMIT, DRIFTING, FIXED_COUNT = "target", "time limit", "sample limit", "drifting", \
    "fixed count"
STOP_REASONS = (TARGET, TIME_LIMIT, SAMPLE_LIMIT, DRIFTING, FIXED_COUNT)


def _check_confidence(confidence: float) -> float:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence: must be in (0, 1), got {confidence!r}")
    return (1 - confidence) / 2


def _tail_rank(n: int, tail: float) -> int:
    """The smallest k with P(B <= k) > tail for B ~ Binomial(n, 1/2): the lower rank l is that k."""
    if n <= _EXACT_UP_TO:
        bound, count, term = Fraction(tail) * (1 << n), 0, 1  # term: C(n, k); compared exactly against tail * 2^n
        for k in range(n + 1):
            count += term
            if count > bound:
                return k
            term = term * (n - k) // (k + 1)
        return n
    log_half, total = n * math.log(2), 0.0
    for k in range(n + 1):
        total += math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) - log_half)
        if total > tail:
            return k
    return n


@functools.lru_cache(maxsize=4096)  # the sampler asks again after every batch, for the halves too
def _ranks(n: int, confidence: float) -> tuple[int, int] | None:
    low = _tail_rank(n, _check_confidence(confidence))
    return (low, n + 1 - low) if low >= 1 else None


def median_ranks(n: int, confidence: float = CONFIDENCE) -> tuple[int, int] | None:
    """The 1-based ranks (l, n + 1 - l) of the order statistics that hold the median of n samples with at least
    `confidence`: the largest l with P(B <= l - 1) <= (1 - confidence) / 2, B ~ Binomial(n, 1/2) (the median lies
    below the l-th smallest sample only when fewer than l samples fall below it). None where even the extremes
    cover less: under 6 samples at 95% ([min, max] of 5 covers 1 - 2/32 = 93.75%)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n: must be a count of samples (an int >= 0), got {n!r}")
    return _ranks(n, confidence)


@functools.lru_cache(maxsize=4096)
def rank_coverage(n: int, low: int) -> float:
    """The exact probability that the order statistics of ranks (low, n + 1 - low) hold the median: 1 - 2 P(B < low)."""
    below = sum(math.comb(n, k) for k in range(low)) if n <= _EXACT_UP_TO else None
    if below is not None:
        return float(1 - 2 * Fraction(below, 1 << n))
    return 1 - 2 * sum(math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) - n * math.log(2))
                       for k in range(low))


@dataclass(frozen=True)
class MedianInterval:
    """A median with the confidence interval its samples support (low and high NaN where they support none)."""

    median: float
    low: float
    high: float
    count: int
    coverage: float  # the exact coverage of the two order statistics (at least the confidence asked); NaN: none

    @property
    def rel_half_width(self) -> float:
        """Half the interval's width over the median (NaN without an interval or a positive median)."""
        if not (self.median > 0 and math.isfinite(self.low) and math.isfinite(self.high)):
            return math.nan
        return (self.high - self.low) / 2 / self.median

    def converged(self, target: float) -> bool:
        """True when a positive target holds the interval's relative half-width."""
        return target > 0 and self.rel_half_width <= target


def median_interval(samples: Sequence[float], confidence: float = CONFIDENCE) -> MedianInterval:
    """The median of `samples` and the interval between the order statistics of median_ranks (distribution-free: it
    assumes only independent samples of one distribution)."""
    ordered = sorted(float(s) for s in samples)
    n = len(ordered)
    if not n:
        return MedianInterval(math.nan, math.nan, math.nan, 0, math.nan)
    median = (ordered[(n - 1) // 2] + ordered[n // 2]) / 2
    ranks = median_ranks(n, confidence)
    if ranks is None:
        return MedianInterval(median, math.nan, math.nan, n, math.nan)
    return MedianInterval(median, ordered[ranks[0] - 1], ordered[ranks[1] - 1], n, rank_coverage(n, ranks[0]))


def half_intervals(samples: Sequence[float], confidence: float = CONFIDENCE) -> tuple[MedianInterval, MedianInterval]:
    """The median intervals of the first and the second half of `samples` in time order (the middle sample of an odd
    count goes to the second)."""
    half = len(samples) // 2
    return median_interval(samples[:half], confidence), median_interval(samples[half:], confidence)


def halves_agree(first: MedianInterval, second: MedianInterval) -> bool:
    """Whether the intervals of two halves' medians overlap (True where either has none: no disagreement shown)."""
    return overlap((first.low, first.high), (second.low, second.high))


def halves_disagree(samples: Sequence[float], confidence: float = CONFIDENCE) -> bool:
    """Whether the first and the second half of `samples` (in time order) disagree: their medians' intervals are
    disjoint; where a half is too small for an interval (under 12 samples), every sample of one half lies beyond every
    sample of the other and that happens by chance with at most 1 - confidence (2 / C(n, half): 8 samples or more)."""
    first, second = half_intervals(samples, confidence)
    if all(math.isfinite(x) for x in (first.low, first.high, second.low, second.high)):
        return not halves_agree(first, second)
    half = len(samples) // 2
    early, late = [float(s) for s in samples[:half]], [float(s) for s in samples[half:]]
    if not early or not late or 2 / math.comb(len(samples), half) > 1 - confidence:
        return False
    return max(early) < min(late) or max(late) < min(early)


def medians_agree(a: MedianInterval, b: MedianInterval) -> bool:
    """Whether each median lies inside the other's interval, a closer test than overlapping intervals (which let two
    medians differ by the sum of both half-widths); False where either has no interval (no agreement shown)."""
    if not all(math.isfinite(x) for x in (a.low, a.high, b.low, b.high)):
        return False
    return a.low <= b.median <= a.high and b.low <= a.median <= b.high


def stop_reason_of(samples: Sequence[float], target: float, limit: str, confidence: float = CONFIDENCE) -> str:
    """Why sampling that stopped at `limit` (TIME_LIMIT, SAMPLE_LIMIT or FIXED_COUNT) stopped: DRIFTING where the
    halves of its samples disagree, TARGET where they agree and a positive target holds the interval of the median,
    else the limit."""
    if halves_disagree(samples, confidence):
        return DRIFTING
    return TARGET if median_interval(samples, confidence).converged(target) else limit


def percentile(ordered: Sequence[float], pct: float) -> float:
    """The pct-th percentile of sorted values, linearly interpolated between ranks (numpy's default)."""
    position = (len(ordered) - 1) * pct / 100
    lo = int(position)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (position - lo)


def outlier_count(samples: Sequence[float], fence: float = FENCE) -> int:
    """How many samples lie beyond Q1 - fence IQR or Q3 + fence IQR (none under 4 samples)."""
    ordered = sorted(float(s) for s in samples)
    if len(ordered) < 4:
        return 0
    q1, q3 = percentile(ordered, 25), percentile(ordered, 75)
    reach = fence * (q3 - q1)
    return sum(1 for s in ordered if s < q1 - reach or s > q3 + reach)


def interval_columns(samples: Sequence[float], target: float, confidence: float = CONFIDENCE, *,
                     stop: str | None = None, warmup_s: float = math.nan) -> dict:
    """A row's interval columns from its latency samples (ms, in time order) and the relative half-width its sampling
    aimed at: the interval, why sampling stopped (`stop`, one of STOP_REASONS; by default as a fixed count would
    have, stop_reason_of), whether it was drifting, the medians of its halves and the warm-up's seconds (NaN: none
    recorded)."""
    if stop is not None and stop not in STOP_REASONS:
        raise ValueError(f"stop: must be one of {', '.join(STOP_REASONS)}, got {stop!r}")
    found = median_interval(samples, confidence)
    first, second = half_intervals(samples, confidence)
    reason = stop if stop is not None else stop_reason_of(samples, target, FIXED_COUNT, confidence)
    return {"latency_ci_low_ms": found.low, "latency_ci_high_ms": found.high, "latency_ci_rel": found.rel_half_width,
            "converged": reason == TARGET, "outliers": outlier_count(samples), "stop_reason": reason,
            "drifting": reason == DRIFTING, "first_half_ms": first.median, "second_half_ms": second.median,
            "warmup_s": float(warmup_s)}


def overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether two intervals (low, high) share a point; an interval with a NaN end overlaps everything (unknown)."""
    if not all(math.isfinite(x) for x in (*a, *b)):
        return True
    return a[0] <= b[1] and b[0] <= a[1]


def ratio_interval(new: MedianInterval | tuple[float, float, float], base: MedianInterval | tuple[float, float, float]
                   ) -> tuple[float, float, float]:
    """new median / base median and its interval from the two medians' intervals, each (median, low, high): the
    arms of the two log-intervals added in quadrature (independent sides, each interval about symmetric in log space:
    the same confidence for the ratio). NaN ends where either side has no interval."""
    (m1, lo1, hi1), (m0, lo0, hi0) = (_triple(new), _triple(base))
    if not all(x > 0 and math.isfinite(x) for x in (m1, lo1, hi1, m0, lo0, hi0)):
        ratio = m1 / m0 if m0 > 0 else math.nan
        return ratio, math.nan, math.nan
    ratio = m1 / m0
    down = math.hypot(math.log(m1 / lo1), math.log(hi0 / m0))
    up = math.hypot(math.log(hi1 / m1), math.log(m0 / lo0))
    return ratio, ratio * math.exp(-down), ratio * math.exp(up)


def _triple(side) -> tuple[float, float, float]:
    if isinstance(side, MedianInterval):
        return side.median, side.low, side.high
    median, low, high = side
    return float(median), float(low), float(high)


# ---------------------------------------------------------------- composed figures (docs/phases.md: how intervals
# propagate). A figure is (value, low, high); NaN ends where a side has no interval.

VERDICTS = ("within", "over", "unresolved")


def sum_interval(terms) -> tuple[float, float, float]:
    """Σ count · median and its interval from terms (count, (median, low, high)): independent medians whose arms add
    in quadrature (each arm taken as a normal error at the same confidence), a row used `count` times moving
    count-fold (one measurement read count times; a negative count swaps its arms)."""
    value, down, up, known = 0.0, 0.0, 0.0, True
    for count, side in terms:
        median, low, high = _triple(side)
        value += count * median
        below, above = count * (median - low), count * (high - median)
        if count < 0:
            below, above = -above, -below
        known &= math.isfinite(below) and math.isfinite(above)
        down, up = down + below * below, up + above * above
    if not (known and math.isfinite(value)):
        return value, math.nan, math.nan
    return value, value - math.sqrt(down), value + math.sqrt(up)


def scale_interval(side, factor: float) -> tuple[float, float, float]:
    """factor · (median, low, high), the ends swapped for a negative factor."""
    median, low, high = _triple(side)
    ends = sorted((factor * low, factor * high)) if math.isfinite(low) and math.isfinite(high) else (math.nan,) * 2
    return factor * median, ends[0], ends[1]


def error_interval(composed, measured) -> tuple[float, float, float]:
    """The error in percent of a composed figure against a measured one, 100 (composed / measured - 1) (< 0: the
    composition is faster), with its interval from both sides' (ratio_interval)."""
    ratio, low, high = ratio_interval(_triple(composed), _triple(measured))
    return 100 * (ratio - 1), 100 * (low - 1), 100 * (high - 1)


def verdict(low: float, high: float, goal: float) -> str:
    """'within' where the whole interval of an error lies within ±goal, 'over' where it lies wholly beyond, and
    'unresolved' where it straddles the goal or is unknown: an error inside the noise is no verdict."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return "unresolved"
    if -goal <= low and high <= goal:
        return "within"
    if low > goal or high < -goal:
        return "over"
    return "unresolved"


def worst_verdict(verdicts) -> str:
    """One verdict of several on one figure: over if any is, within if all are, unresolved otherwise."""
    found = list(verdicts)
    if "over" in found:
        return "over"
    return "within" if found and all(v == "within" for v in found) else "unresolved"
