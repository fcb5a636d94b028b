"""Intervals between runs, from a row's rounds: Student's t on the log medians of its rounds (each round in a process
of its own, at another moment of the run), the interval a repeat of the run lands in, and the interval of a ratio
of two runs (Welch); no torch."""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence

CONFIDENCE = 0.95
SEP = "/"  # round_latencies_ms in a CSV cell: "2.21/2.25/2.19"; a round missing is blank, one measured again "2.3r"
RETRIED = "r"
# The least spread of the rounds' log medians taken as their standard deviation: rounds that tie would otherwise give an
# interval of no width, and a verdict of full confidence. At least 0.1%, and at least the timer's resolution over the
# figure: CUDA events step by 0.5 us, and the rounds of a kernel of a few microseconds tie on those steps.
S_FLOOR = 0.001
RESOLUTION_MS = 0.001


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1, a - 1
    c, d = 1.0, 1 - qab * x / qap
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1 + num * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < 1e-14:
            break
    return h


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _beta_fraction(a, b, x) / a
    return 1 - front * _beta_fraction(b, a, 1 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom (df > 0, not necessarily an integer)."""
    if not df > 0:
        raise ValueError(f"df: must be positive, got {df!r}")
    tail = 0.5 * _incomplete_beta(df / 2, 0.5, df / (df + t * t))
    return 1 - tail if t >= 0 else tail


@functools.lru_cache(maxsize=256)
def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom, by bisection on t_cdf."""
    if not 0 < p < 1:
        raise ValueError(f"p: must be in (0, 1), got {p!r}")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if t_cdf(mid, df) < p else (low, mid)
        if high - low < 1e-12 * max(1.0, high):
            break
    return (low + high) / 2


def _logs(values: Sequence[float]) -> list[float]:
    found = [float(v) for v in values]
    if any(not (math.isfinite(v) and v > 0) for v in found):
        return []
    return [math.log(v) for v in found]


def _sd(logs: Sequence[float]) -> float:
    """The spread of log medians (of ms), at least S_FLOOR and RESOLUTION_MS over their geometric mean."""
    return max(statistics.stdev(logs), S_FLOOR, RESOLUTION_MS / math.exp(statistics.fmean(logs)))


def run_figure(round_medians: Sequence[float]) -> float:
    """A run's figure from its rounds: the geometric mean of their medians, each round (its process, its moment)
    counting once, whatever its sample count. NaN without a positive median."""
    logs = _logs(round_medians)
    return math.exp(statistics.fmean(logs)) if logs else math.nan


def run_interval(round_medians: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The interval of run_figure with `confidence`: in log space its log ± t(R - 1) · s / sqrt(R), s the standard
    deviation of the rounds' log medians (at least S_FLOOR): what the run's processes and moments say of the figure
    they estimate. (NaN, NaN) under two rounds."""
    logs = _logs(round_medians)
    if len(logs) < 2:
        return math.nan, math.nan
    center = statistics.fmean(logs)
    half = t_quantile(1 - (1 - confidence) / 2, len(logs) - 1) * _sd(logs) / math.sqrt(len(logs))
    return math.exp(center - half), math.exp(center + half)


def repeat_interval(round_medians: Sequence[float], center: float,
                    confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Where the figure of a repeat of the run (another run of as many rounds, run_figure) lands with `confidence`,
    centred on this run's `center` (its run_figure): in log space center ± t(R - 1) · s · sqrt(2 / R), s the standard
    deviation of the log medians of its R rounds, at least S_FLOOR (this run's figure and the repeat's each average R
    rounds: their difference has twice the variance of one). (NaN, NaN) under two rounds or with a median that is not
    positive."""
    logs = _logs(round_medians)
    if len(logs) < 2 or not (math.isfinite(center) and center > 0):
        return math.nan, math.nan
    r = len(logs)
    half = t_quantile(1 - (1 - confidence) / 2, r - 1) * _sd(logs) * math.sqrt(2 / r)
    return center * math.exp(-half), center * math.exp(half)


def ratio_between_runs(new_rounds: Sequence[float], base_rounds: Sequence[float], ratio: float,
                       confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """The interval of `ratio` (new / base) from the rounds' medians of two runs: Welch's t interval of the
    difference of their mean log medians (unequal variances, Welch-Satterthwaite degrees of freedom), applied around
    `ratio`; returns (low, high, degrees of freedom). NaN where a side has under two rounds. Two runs of the same
    code then land outside it with probability 1 - confidence, when each round's median is an independent draw of one
    distribution of the run (what the rounds in processes of their own, at moments across the run, are for)."""
    new, base = _logs(new_rounds), _logs(base_rounds)
    if len(new) < 2 or len(base) < 2 or not (math.isfinite(ratio) and ratio > 0):
        return math.nan, math.nan, math.nan
    vn, vb = _sd(new) ** 2 / len(new), _sd(base) ** 2 / len(base)
    se2 = vn + vb
    df = se2 ** 2 / (vn ** 2 / (len(new) - 1) + vb ** 2 / (len(base) - 1))
    half = t_quantile(1 - (1 - confidence) / 2, df) * math.sqrt(se2)
    return ratio * math.exp(-half), ratio * math.exp(half), df


def latencies_text(values: Sequence[float | None], retried: Sequence[bool] = ()) -> str:
    """The rounds' medians as one CSV cell, in the order of the rounds ('2.21/2.25/2.19'), each to 6 significant
    digits; a round without one (None) blank, one measured again at the end of the run (a noisy round retried, not in
    its round's process and moment) marked 'r'."""
    marks = list(retried) + [False] * (len(values) - len(retried))
    return SEP.join("" if v is None else f"{float(v):.6g}{RETRIED if again else ''}"
                    for v, again in zip(values, marks, strict=True))


def round_slots(cell) -> list[tuple[float, bool] | None]:
    """The rounds of a CSV cell (latencies_text) in round order: (median, measured again) or None for a round
    without one; [] for a blank cell. A list of numbers reads as rounds measured in their turn."""
    if cell is None or (isinstance(cell, float) and math.isnan(cell)):
        return []
    if isinstance(cell, (list, tuple)):
        return [(float(v), False) for v in cell]
    text = str(cell).strip()
    if not text:
        return []
    return [None if not part else (float(part.removesuffix(RETRIED)), part.endswith(RETRIED))
            for part in text.split(SEP)]


def latencies_of(cell) -> list[float]:
    """The rounds' medians of a CSV cell (latencies_text), a list, or blank (no rounds: [])."""
    return [slot[0] for slot in round_slots(cell) if slot is not None]


def paired_rounds(new_cell, base_cell) -> tuple[list[float], list[float]]:
    """The medians of the rounds two rows of one run share, round by round: both measured in that round's turn (in
    its process and moment), neither measured again at the end."""
    pairs = [(n[0], b[0]) for n, b in zip(round_slots(new_cell), round_slots(base_cell), strict=False)
             if n is not None and b is not None and not n[1] and not b[1]]
    return [n for n, _ in pairs], [b for _, b in pairs]


def paired_ratio(new_rounds: Sequence[float], base_rounds: Sequence[float], ratio: float,
                 confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The interval of `ratio` (new / base) from rounds paired one to one (two impls measured in the same rounds of
    one run: the same worker process and moment): Student's t on the per-round log ratios, applied around `ratio`.
    NaN under two pairs or unequal counts."""
    new, base = _logs(new_rounds), _logs(base_rounds)
    if len(new) != len(base) or len(new) < 2 or not (math.isfinite(ratio) and ratio > 0):
        return math.nan, math.nan
    differences = [n - b for n, b in zip(new, base, strict=True)]
    floor = math.hypot(*(RESOLUTION_MS / math.exp(statistics.fmean(side)) for side in (new, base)))
    spread = max(statistics.stdev(differences), S_FLOOR, floor)
    half = t_quantile(1 - (1 - confidence) / 2, len(differences) - 1) * spread / math.sqrt(len(differences))
    return ratio * math.exp(-half), ratio * math.exp(half)
