"""Speculative decoding's arithmetic (no torch): tokens per target pass for i.i.d. acceptance, the time of one
draft-then-verify iteration, tokens/s, the speedup over plain decode, the best draft length and the break-even
acceptance, and the table `phases --speculate` writes from measured steps.

A draft proposes γ tokens one decode step at a time; the target verifies them in one pass over γ + 1 positions and
keeps the accepted prefix plus its own next token, so one iteration yields T tokens, T = min(G, γ) + 1 with G the
number of leading acceptances (Leviathan et al., 2023): E[T] = (1 - α^(γ+1)) / (1 - α).
"""

from __future__ import annotations

import math
from numbers import Real

import numpy as np
import pandas as pd

COLUMNS = ("batch", "context", "gamma", "alpha", "expected_tokens_per_pass", "tpot_ms", "draft_step_ms", "verify_ms",
           "iteration_ms", "tokens_per_s_per_user", "tokens_per_s", "plain_tokens_per_s_per_user", "speedup",
           "best_gamma", "break_even_alpha", "missing")


def check_alpha(alpha, *, open_interval: bool = False) -> float:
    """α as a float in [0, 1] ((0, 1) with open_interval, as the CLI takes it); one-line ValueError otherwise."""
    if isinstance(alpha, bool) or not isinstance(alpha, Real) or not math.isfinite(alpha):
        raise ValueError(f"alpha: must be a number, got {alpha!r}")
    low_ok = alpha > 0 if open_interval else alpha >= 0
    high_ok = alpha < 1 if open_interval else alpha <= 1
    if not (low_ok and high_ok):
        raise ValueError(f"alpha: the acceptance rate must lie in {'(0, 1)' if open_interval else '[0, 1]'}, "
                         f"got {alpha!r}")
    return float(alpha)


def check_gamma(gamma) -> int:
    """γ as an int >= 1; one-line ValueError otherwise."""
    if isinstance(gamma, bool) or not isinstance(gamma, int | np.integer) or gamma < 1:
        raise ValueError(f"gamma: the draft tokens per iteration must be an int >= 1, got {gamma!r}")
    return int(gamma)


def expected_tokens(alpha, gamma) -> float:
    """E(α, γ) = (1 - α^(γ+1)) / (1 - α): tokens one target pass yields on average; γ + 1 at α = 1."""
    a, g = check_alpha(alpha), check_gamma(gamma)
    return float(g + 1) if a == 1.0 else (1.0 - a ** (g + 1)) / (1.0 - a)


def tokens_distribution(alpha, gamma) -> np.ndarray:
    """P(T = k) for k = 1..γ+1: α^(k-1)(1-α) below γ + 1, α^γ at γ + 1 (every proposal accepted)."""
    a, g = check_alpha(alpha), check_gamma(gamma)
    k = np.arange(1, g + 1, dtype=np.float64)
    return np.append(a ** (k - 1) * (1.0 - a), a ** g)


def tokens_std(alpha, gamma) -> float:
    """The standard deviation of T, the tokens of one iteration (the spread a loop's realised mean is judged by)."""
    p = tokens_distribution(alpha, gamma)
    k = np.arange(1, len(p) + 1, dtype=np.float64)
    mean = float(p @ k)
    return math.sqrt(max(float(p @ k ** 2) - mean ** 2, 0.0))


def iteration_ms(gamma, draft_step_ms: float, verify_ms: float) -> float:
    """One iteration: γ draft decode steps, then one verify pass over γ + 1 positions."""
    return check_gamma(gamma) * draft_step_ms + verify_ms


def tokens_per_s_per_user(alpha, gamma, draft_step_ms: float, verify_ms: float) -> float:
    """E(α, γ) tokens per iteration, per sequence of the batch."""
    return 1e3 * expected_tokens(alpha, gamma) / iteration_ms(gamma, draft_step_ms, verify_ms)


def speedup(alpha, gamma, draft_step_ms: float, verify_ms: float, tpot_ms: float) -> float:
    """Speculation's tokens/s over plain decode's (one token per target step of tpot_ms)."""
    return tokens_per_s_per_user(alpha, gamma, draft_step_ms, verify_ms) * tpot_ms / 1e3


def break_even_alpha(gamma, draft_step_ms: float, verify_ms: float, tpot_ms: float) -> float:
    """The α at which speedup = 1: the root in [0, 1] of E(α, γ) = iteration / TPOT, i.e. of the polynomial
    1 + α + ... + α^γ - r (increasing on [0, 1], so the root is unique). 0.0 where speculation pays at any α
    (r <= 1), nan where it never does (r > γ + 1)."""
    g = check_gamma(gamma)
    r = iteration_ms(g, draft_step_ms, verify_ms) / tpot_ms
    if not math.isfinite(r):
        return math.nan
    if r <= 1.0:
        return 0.0
    if r > g + 1:
        return math.nan
    coefficients = np.ones(g + 1)  # highest power first, as numpy.roots takes them
    coefficients[-1] = 1.0 - r
    roots = np.roots(coefficients)
    real = roots[(np.abs(roots.imag) < 1e-7) & (roots.real > -1e-9) & (roots.real < 1 + 1e-9)].real
    a = float(np.clip(real.min() if len(real) else 1.0, 0.0, 1.0))
    for _ in range(3):  # Newton polishes the eigenvalue solver's root to float64 precision
        powers = a ** np.arange(g + 1)
        slope = float(np.arange(1, g + 1) @ powers[:-1])
        if slope == 0.0:
            break
        a = float(np.clip(a - (powers.sum() - r) / slope, 0.0, 1.0))
    return a


def best_gamma(alpha, verify_ms: dict, draft_step_ms: float) -> int:
    """The γ of `verify_ms` (γ -> the verify pass's ms) that gives the most tokens/s at α; the smaller on a tie."""
    rates = {g: tokens_per_s_per_user(alpha, g, draft_step_ms, ms) for g, ms in sorted(verify_ms.items())}
    return max(rates, key=lambda g: (rates[g], -g))


def speculative_table(steps: dict, batches, context: int, gammas, alphas) -> pd.DataFrame:
    """One row per (batch, γ, α) from composed step times: steps[("tpot", b)], steps[("draft", b)] and
    steps[("verify", b, γ)] are (ms, missing ops). `best_gamma` marks the γ with the most tokens/s at each (batch,
    α), `break_even_alpha` is per (batch, γ); rows with a missing op are nan and never best."""
    rows = []
    for batch in batches:
        tpot, tpot_missing = steps[("tpot", batch)]
        draft, draft_missing = steps[("draft", batch)]
        for gamma in gammas:
            verify, verify_missing = steps[("verify", batch, gamma)]
            missing = tpot_missing + draft_missing + verify_missing
            even = break_even_alpha(gamma, draft, verify, tpot) if not missing else math.nan
            for alpha in alphas:
                e = expected_tokens(alpha, gamma)
                iteration = iteration_ms(gamma, draft, verify)
                per_user = 1e3 * e / iteration
                rows.append({"batch": batch, "context": context, "gamma": gamma, "alpha": alpha,
                             "expected_tokens_per_pass": e, "tpot_ms": tpot, "draft_step_ms": draft,
                             "verify_ms": verify, "iteration_ms": iteration, "tokens_per_s_per_user": per_user,
                             "tokens_per_s": batch * per_user, "plain_tokens_per_s_per_user": 1e3 / tpot,
                             "speedup": per_user * tpot / 1e3, "break_even_alpha": even, "missing": missing})
    table = pd.DataFrame(rows, columns=[c for c in COLUMNS if c != "best_gamma"])
    rate = table["tokens_per_s_per_user"].where(table["missing"] == 0)
    table["best_gamma"] = False
    for _, group in table.groupby(["batch", "alpha"]):
        finite = rate[group.index].dropna()
        if len(finite):  # the smaller γ on a tie: rows are in increasing γ and idxmax takes the first
            table.loc[finite.idxmax(), "best_gamma"] = True
    return table[list(COLUMNS)]


def best_gammas(table: pd.DataFrame) -> pd.DataFrame:
    """Per (batch, α): the best γ, its tokens/s per user and its speedup (rows marked best_gamma)."""
    best = table[table["best_gamma"].astype(bool)]
    return best[["batch", "alpha", "gamma", "tokens_per_s_per_user", "speedup"]].reset_index(drop=True)


def break_evens(table: pd.DataFrame) -> pd.DataFrame:
    """Per (batch, γ): the break-even α and what the iteration costs in target decode steps."""
    first = table.drop_duplicates(["batch", "gamma"])
    out = first[["batch", "gamma", "break_even_alpha", "draft_step_ms", "verify_ms", "tpot_ms"]].copy()
    out["iteration_in_tpot"] = first["iteration_ms"] / first["tpot_ms"]
    return out.reset_index(drop=True)
