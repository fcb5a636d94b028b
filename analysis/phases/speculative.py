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

from ...bench.spec import steps as step_defs
from ...bench.spec.models import DecoderConfig
from . import model as pm

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


def composed_steps(target: DecoderConfig, draft: DecoderConfig, target_rows, draft_rows, batches, context: int,
                   gammas, page_size: int = 0) -> dict:
    """The steps speculative_table reads, composed by the phase model: the target's decode step (TPOT), the draft's
    decode step and the target's verify pass per γ, each (ms, ops missing); *_rows are phase_model.Measured."""
    steps = {}
    for batch in batches:
        for key, measured, step in ((("tpot", batch), target_rows, step_defs.decode_step(target, batch, context,
                                                                                       page_size)),
                                    (("draft", batch), draft_rows, step_defs.decode_step(draft, batch, context,
                                                                                       page_size))):
            t = pm.step_time(measured, step)
            steps[key] = (t.total_ms, len(t.missing))
        for gamma in gammas:
            t = pm.step_time(target_rows, step_defs.verify_step(target, batch, context, gamma, page_size))
            steps[("verify", batch, gamma)] = (t.total_ms, len(t.missing))
    return steps


CHECK_COLUMNS = ("batch", "gamma", "alpha", "layers", "draft_layers", "iterations", "expected_tokens_per_pass",
                 "realised_tokens_per_pass", "tokens_std", "realised_z", "loop_iteration_ms", "loop_p90_ms",
                 "composed_iteration_ms", "loop_tokens_per_s_per_user", "composed_tokens_per_s_per_user", "error_pct",
                 "published_error_pct", "plain_ms", "loop_speedup", "composed_speedup", "goal_pct", "over_goal",
                 "noisy_brackets", "brackets")


def _composed_iteration(steps: dict, batch: int, gamma: int) -> float:
    (draft, draft_missing), (verify, verify_missing) = steps[("draft", batch)], steps[("verify", batch, gamma)]
    return math.nan if draft_missing or verify_missing else iteration_ms(gamma, draft, verify)


def loop_check_table(loops: pd.DataFrame, composed: dict, published: dict, *, layers: int, draft_layers: int,
                     goal_pct: float) -> pd.DataFrame:
    """The composition against the real loop per (batch, γ, α). `loops`: one row per bracket and loop (kind
    speculative or plain, `ms` and `tokens` per iteration); `composed` and `published`: composed_steps of the cut
    models from the rows interleaved with the loop and from the published rows. The composed tokens/s takes the
    loop's realised tokens per iteration, so error_pct is the composition's timing error alone; the draws' own
    spread is realised_z (realised - E over its standard error)."""
    rows = []
    ok = loops[loops["kind"].isin(["speculative", "plain"])] if len(loops) else loops
    for (batch, gamma, alpha), group in (ok[ok["kind"] == "speculative"].groupby(["batch", "gamma", "alpha"])
                                         if len(ok) else ()):
        batch, gamma, alpha = int(batch), int(gamma), float(alpha)  # a row that says why a loop failed has no γ
        quiet = group[~group["noisy"].astype(bool)]
        used = quiet if len(quiet) else group
        ms = np.concatenate([np.asarray(m, float) for m in used["ms"]])
        tokens = np.concatenate([np.asarray(t, float) for t in group["tokens"]])  # every draw counts
        plain = ok[(ok["kind"] == "plain") & (ok["batch"] == batch)]
        quiet_plain = plain[~plain["noisy"].astype(bool)]
        plain = quiet_plain if len(quiet_plain) else plain  # as the loops: quiet brackets where there are any
        plain_ms = float(np.mean(np.concatenate([np.asarray(m, float) for m in plain["ms"]]))) if len(plain) \
            else math.nan
        e, std = expected_tokens(alpha, gamma), tokens_std(alpha, gamma)
        realised, loop_ms = float(tokens.mean()), float(ms.mean())
        loop_tps = 1e3 * realised / loop_ms

        comp_ms, pub_ms = (_composed_iteration(steps, batch, gamma) for steps in (composed, published))
        comp_tps = 1e3 * realised / comp_ms
        tpot = composed[("tpot", batch)][0]
        error = 100 * (comp_tps - loop_tps) / loop_tps
        rows.append({"batch": batch, "gamma": gamma, "alpha": alpha, "layers": layers, "draft_layers": draft_layers,
                     "iterations": len(tokens), "expected_tokens_per_pass": e, "realised_tokens_per_pass": realised,
                     "tokens_std": std, "realised_z": (realised - e) / (std / math.sqrt(len(tokens))) if std else 0.0,
                     "loop_iteration_ms": loop_ms, "loop_p90_ms": float(np.percentile(ms, 90)),
                     "composed_iteration_ms": comp_ms, "loop_tokens_per_s_per_user": loop_tps,
                     "composed_tokens_per_s_per_user": comp_tps, "error_pct": error,
                     "published_error_pct": 100 * (loop_ms / pub_ms - 1),
                     "plain_ms": plain_ms, "loop_speedup": realised * plain_ms / loop_ms,
                     "composed_speedup": realised * tpot / comp_ms, "goal_pct": goal_pct,
                     "over_goal": bool(abs(error) > goal_pct) if math.isfinite(error) else True,
                     "noisy_brackets": int(group["noisy"].astype(bool).sum()), "brackets": len(group)})
    return pd.DataFrame(rows, columns=list(CHECK_COLUMNS))
