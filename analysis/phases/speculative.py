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
from ...bench.spec.interval import (
    error_interval,
    median_interval,
    ratio_interval,
    sum_interval,
    verdict,
    worst_verdict,
)
from ...bench.spec.models import DecoderConfig
from . import model as pm

COLUMNS = ("batch", "context", "gamma", "alpha", "expected_tokens_per_pass", "tpot_ms", "plain_padded_to",
           "draft_step_ms", "draft_padded_to", "verify_ms", "verify_padded_to", "iteration_ms",
           "tokens_per_s_per_user", "tokens_per_s", "plain_tokens_per_s_per_user", "speedup", "speedup_low",
           "speedup_high", "exceeds_e", "loop_shapes", "best_gamma", "break_even_alpha", "missing")


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


def step_of(steps: dict, key) -> tuple[float, int, float, float, tuple]:
    """(ms, ops missing, low, high, one layer's (ms, low, high)) of a composed step; a step given as (ms, missing)
    has no interval."""
    found = tuple(steps[key]) + (math.nan, math.nan, (math.nan,) * 3)[len(steps[key]) - 2:]
    return found[0], int(found[1]), found[2], found[3], tuple(found[4])


def padded(steps: dict, kind: str, batch: int, gamma: int | None = None) -> tuple[tuple, str, int]:
    """The fastest complete step a server could run `batch` sequences in: of kind "tpot" or "draft" over the
    composed batches B' >= batch, of kind "verify" over the passes B' x (γ' + 1) with B' >= batch and γ' >= gamma
    (padding rows or positions). ((ms, low, high), what it was padded to ("" where none is complete), ops missing
    of the unpadded step)."""
    unpadded = (kind, batch) if gamma is None else (kind, batch, gamma)
    missing = step_of(steps, unpadded)[1] if unpadded in steps else 1
    best, label = None, ""
    for key in steps:
        if key[0] != kind or key[1] < batch or (gamma is not None and key[2] < gamma):
            continue
        ms, lost, low, high, _ = step_of(steps, key)
        if lost or not math.isfinite(ms) or (best is not None and ms >= best[0]):
            continue
        best, label = (ms, low, high), str(key[1]) if gamma is None else f"{key[1]}x{key[2] + 1}"
    return (best or (math.nan,) * 3), label, (missing if best is None else 0)


def speculative_table(steps: dict, batches, context: int, gammas, alphas) -> pd.DataFrame:
    """One row per (batch, γ, α) from composed step times: steps[("tpot", b)], steps[("draft", b)] and
    steps[("verify", b, γ)], each (ms, missing ops[, low, high, layer]). Plain decode, the draft step and the verify
    pass each take the fastest complete step a server could pad to (padded; the table says which: plain_padded_to,
    draft_padded_to, verify_padded_to as B' or B' x positions); the speedup carries its interval (the ratio of plain
    decode's to the iteration's, the iteration the sum of γ draft steps and the verify) and exceeds_e marks a speedup
    above E(α, γ), what a verify no faster than plain decode allows; loop_shapes where no step was padded (the
    shapes the loop check runs: a padded row's speedup is not the one it checks). `best_gamma` marks the γ with the
    most tokens/s at each (batch, α), `break_even_alpha` is per (batch, γ); rows with a missing op are nan, and they
    and rows past E are never best."""
    rows = []
    for batch in batches:
        tpot, plain_to, tpot_missing = padded(steps, "tpot", batch)
        draft, draft_to, draft_missing = padded(steps, "draft", batch)
        for gamma in gammas:
            verify, verify_to, verify_missing = padded(steps, "verify", batch, gamma)
            missing = tpot_missing + draft_missing + verify_missing
            even = break_even_alpha(gamma, draft[0], verify[0], tpot[0]) if not missing else math.nan
            iteration = sum_interval(((gamma, draft), (1, verify)))
            ratio = ratio_interval(tpot, iteration)
            for alpha in alphas:
                e = expected_tokens(alpha, gamma)
                per_user = 1e3 * e / iteration[0]
                rows.append({"batch": batch, "context": context, "gamma": gamma, "alpha": alpha,
                             "expected_tokens_per_pass": e, "tpot_ms": tpot[0], "plain_padded_to": plain_to,
                             "draft_step_ms": draft[0], "draft_padded_to": draft_to, "verify_ms": verify[0],
                             "verify_padded_to": verify_to, "iteration_ms": iteration[0],
                             "tokens_per_s_per_user": per_user, "tokens_per_s": batch * per_user,
                             "plain_tokens_per_s_per_user": 1e3 / tpot[0], "speedup": per_user * tpot[0] / 1e3,
                             "speedup_low": e * ratio[1], "speedup_high": e * ratio[2],
                             "exceeds_e": bool(per_user * tpot[0] / 1e3 > e), "break_even_alpha": even,
                             "loop_shapes": (plain_to, draft_to, verify_to) == (str(batch), str(batch),
                                                                                f"{batch}x{gamma + 1}"),
                             "missing": missing})
    table = pd.DataFrame(rows, columns=[c for c in COLUMNS if c != "best_gamma"])
    # a speedup past E is a composition to doubt (the verify composed faster than plain decode), never the best γ
    rate = table["tokens_per_s_per_user"].where((table["missing"] == 0) & ~table["exceeds_e"].astype(bool))
    table["best_gamma"] = False
    for _, group in table.groupby(["batch", "alpha"]):
        finite = rate[group.index].dropna()
        if len(finite):  # the smaller γ on a tie: rows are in increasing γ and idxmax takes the first
            table.loc[finite.idxmax(), "best_gamma"] = True
    return table[list(COLUMNS)]


def best_gammas(table: pd.DataFrame) -> pd.DataFrame:
    """Per (batch, α): the best γ, its tokens/s per user and its speedup with its interval, E, and the shapes plain
    decode and the verify were padded to (rows marked best_gamma; the columns a table of its age has)."""
    best = table[table["best_gamma"].astype(bool)]
    columns = ("batch", "alpha", "gamma", "tokens_per_s_per_user", "speedup", "speedup_low", "speedup_high",
               "expected_tokens_per_pass", "plain_padded_to", "verify_padded_to", "exceeds_e")
    return best[[c for c in columns if c in best]].reset_index(drop=True)


def break_evens(table: pd.DataFrame) -> pd.DataFrame:
    """Per (batch, γ): the break-even α and what the iteration costs in target decode steps."""
    first = table.drop_duplicates(["batch", "gamma"])
    out = first[["batch", "gamma", "break_even_alpha", "draft_step_ms", "verify_ms", "tpot_ms"]].copy()
    out["iteration_in_tpot"] = first["iteration_ms"] / first["tpot_ms"]
    return out.reset_index(drop=True)


def composed_steps(target: DecoderConfig, draft: DecoderConfig, target_rows, draft_rows, batches, context: int,
                   gammas, page_size: int = 0, plain_batches=()) -> dict:
    """The steps speculative_table reads, composed by the phase model: the target's decode step (TPOT) at `batches`
    and `plain_batches` (what plain decode may be padded to), the draft's decode step and the target's verify pass
    per γ at `batches`, each (ms, ops missing, low, high, one layer's (ms, low, high)); *_rows are
    phase_model.Measured."""
    steps = {}

    def put(key, measured, uses, layers):
        t = pm.step_time(measured, uses)
        steps[key] = (t.total_ms, len(t.missing), t.low_ms, t.high_ms, t.layer_interval(layers))

    for batch in sorted({*batches, *plain_batches}):
        put(("tpot", batch), target_rows, step_defs.decode_step(target, batch, context, page_size), target.layers)
    for batch in batches:
        put(("draft", batch), draft_rows, step_defs.decode_step(draft, batch, context, page_size), draft.layers)
        for gamma in gammas:
            put(("verify", batch, gamma), target_rows, step_defs.verify_step(target, batch, context, gamma, page_size),
                target.layers)
    return steps


CHECK_COLUMNS = ("batch", "gamma", "alpha", "layers", "draft_layers", "iterations", "expected_tokens_per_pass",
                 "realised_tokens_per_pass", "tokens_std", "realised_z", "loop_iteration_ms", "loop_iteration_low_ms",
                 "loop_iteration_high_ms", "loop_p90_ms", "composed_iteration_ms", "loop_tokens_per_s_per_user",
                 "composed_tokens_per_s_per_user", "error_pct", "error_low_pct", "error_high_pct",
                 "published_iteration_ms", "published_error_pct", "published_error_low_pct",
                 "published_error_high_pct", "published_verdict", "deep_layers", "deep_draft_layers",
                 "per_layer_loop_ms", "per_layer_composed_ms", "per_layer_error_pct", "per_layer_error_low_pct",
                 "per_layer_error_high_pct", "per_layer_verdict", "plain_ms", "loop_speedup", "composed_speedup",
                 "speedup_error_pct", "speedup_error_low_pct", "speedup_error_high_pct", "speedup_verdict",
                 "goal_pct", "verdict", "over_goal", "noisy_brackets", "brackets")
NAN3 = (math.nan,) * 3


def _iteration(steps: dict, batch: int, gamma: int) -> tuple[float, float, float]:
    """γ draft steps and one verify pass, (ms, low, high); NaN where an op is missing."""
    draft, verify = step_of(steps, ("draft", batch)), step_of(steps, ("verify", batch, gamma))
    if draft[1] or verify[1]:
        return NAN3
    return sum_interval(((gamma, draft[:1] + draft[2:4]), (1, verify[:1] + verify[2:4])))


def _samples(rows: pd.DataFrame, column: str = "ms") -> np.ndarray:
    """The rows' per-iteration values, those of quiet brackets where there are any."""
    quiet = rows[~rows["noisy"].astype(bool)] if len(rows) else rows
    used = quiet if len(quiet) else rows
    return np.concatenate([np.asarray(m, float) for m in used[column]]) if len(used) else np.array([])


def _median(values) -> tuple[float, float, float]:
    found = median_interval(list(values))
    return found.median, found.low, found.high


def _error(prefix: str, composed, measured, goal: float) -> dict:
    error, low, high = error_interval(composed, measured)
    return {f"{prefix}_pct": error, f"{prefix}_low_pct": low, f"{prefix}_high_pct": high,
            **({} if prefix == "error" else {f"{prefix.removesuffix('_error')}_verdict": verdict(low, high, goal)})}


def loop_check_table(loops: pd.DataFrame, composed: dict, published: dict, *, layers: int, draft_layers: int,
                     goal_pct: float, deep: dict | None = None) -> pd.DataFrame:
    """The composition against the real loop per (batch, γ, α). `loops`: one row per bracket, depth and loop (kind
    speculative or plain, `layers` the target's depth (L where absent), `ms` and `tokens` per iteration);
    `composed` and `published`: composed_steps of the cut models from the rows interleaved with the loop and from
    the published rows; `deep`: {"layers", "draft_layers", "published"} of the models cut to 2L. Every error is
    composed / measured - 1 (< 0: the composition's time is shorter, as in the reference check), with its 95%
    interval from both sides (a loop's iteration time: the median of its iterations): error_pct from the
    interleaved rows (the composition's timing error alone: it takes the loop's realised tokens), published_error
    from the published rows, per_layer_error from the two depths ((2L - L) / L on both sides: the heads cancel, so
    it speaks for the layers a full model adds), speedup_error the published speedup (plain decode at the batch over
    the iteration) against the loop's. Each judged within / over / unresolved against the goal; verdict: over if
    one is, within if all are. The draws' own spread is realised_z (realised - E over its standard error)."""
    rows = []
    depth = pd.to_numeric(loops["layers"], errors="coerce").fillna(layers) if "layers" in loops and len(loops) \
        else pd.Series(layers, index=loops.index, dtype=float)
    ok = loops[loops["kind"].isin(["speculative", "plain"]) & (depth == layers)] if len(loops) else loops
    deep_rows = loops[loops["kind"].isin(["speculative", "plain"]) & (depth == deep["layers"])] \
        if deep and len(loops) else loops.iloc[:0]
    for (batch, gamma, alpha), group in (ok[ok["kind"] == "speculative"].groupby(["batch", "gamma", "alpha"])
                                         if len(ok) else ()):
        batch, gamma, alpha = int(batch), int(gamma), float(alpha)  # a row that says why a loop failed has no γ
        ms = _samples(group)
        tokens = np.concatenate([np.asarray(t, float) for t in group["tokens"]])  # every draw counts
        loop = _median(ms)
        plain = _median(_samples(ok[(ok["kind"] == "plain") & (ok["batch"] == batch)]))
        e, std = expected_tokens(alpha, gamma), tokens_std(alpha, gamma)
        realised = float(tokens.mean())
        comp, pub = _iteration(composed, batch, gamma), _iteration(published, batch, gamma)
        tpot = step_of(published, ("tpot", batch))
        composed_speedup = ratio_interval(tpot[:1] + tpot[2:4], pub) if not tpot[1] else NAN3
        loop_speedup = ratio_interval(plain, loop)
        row = {"batch": batch, "gamma": gamma, "alpha": alpha, "layers": layers, "draft_layers": draft_layers,
               "iterations": len(tokens), "expected_tokens_per_pass": e, "realised_tokens_per_pass": realised,
               "tokens_std": std, "realised_z": (realised - e) / (std / math.sqrt(len(tokens))) if std else 0.0,
               "loop_iteration_ms": loop[0], "loop_iteration_low_ms": loop[1], "loop_iteration_high_ms": loop[2],
               # a p90 needs 10 iterations at least (one in ten above it); fewer: blank, the tail is their max
               "loop_p90_ms": float(np.percentile(ms, 90)) if len(ms) >= 10 else math.nan,
               "composed_iteration_ms": comp[0], "loop_tokens_per_s_per_user": 1e3 * realised / loop[0],
               "composed_tokens_per_s_per_user": 1e3 * realised / comp[0], **_error("error", comp, loop, goal_pct),
               "published_iteration_ms": pub[0], **_error("published_error", pub, loop, goal_pct),
               "plain_ms": plain[0], "loop_speedup": realised * loop_speedup[0],
               "composed_speedup": realised * composed_speedup[0],
               **_error("speedup_error", composed_speedup, loop_speedup, goal_pct), "goal_pct": goal_pct,
               "noisy_brackets": int(group["noisy"].astype(bool).sum()), "brackets": len(group)}
        row.update(_per_layer(deep, deep_rows, batch, gamma, alpha, loop, pub, layers, draft_layers, goal_pct))
        judged = [row[f"{name}_verdict"] for name in ("published", "per_layer", "speedup")
                  if math.isfinite(row[f"{name}_error_pct"])]
        row["verdict"] = worst_verdict(judged)
        row["over_goal"] = row["verdict"] == "over"
        rows.append(row)
    return pd.DataFrame(rows, columns=list(CHECK_COLUMNS))


def _per_layer(deep: dict | None, deep_rows: pd.DataFrame, batch: int, gamma: int, alpha: float, loop: tuple,
               pub: tuple, layers: int, draft_layers: int, goal: float) -> dict:
    """The per-layer error of one (batch, γ, α): the loop at 2L less at L over the layers added, against the
    published composition's the same way (its interval from one layer of the verify and γ of the draft, those the
    deeper models add)."""
    empty = {"deep_layers": deep["layers"] if deep else math.nan, "deep_draft_layers": deep["draft_layers"] if deep
             else math.nan, "per_layer_loop_ms": math.nan, "per_layer_composed_ms": math.nan,
             "per_layer_error_pct": math.nan, "per_layer_error_low_pct": math.nan,
             "per_layer_error_high_pct": math.nan, "per_layer_verdict": "unresolved"}
    if not deep:
        return empty
    mine = deep_rows[(deep_rows["kind"] == "speculative") & (deep_rows["batch"] == batch)
                     & (deep_rows["gamma"] == gamma) & np.isclose(deep_rows["alpha"].astype(float), alpha)]
    added, draft_added = deep["layers"] - layers, deep["draft_layers"] - draft_layers
    deeper = _iteration(deep["published"], batch, gamma)
    if not len(mine) or added <= 0 or not math.isfinite(deeper[0] + pub[0]):
        return empty
    loop_layer = sum_interval(((1 / added, _median(_samples(mine))), (-1 / added, loop)))
    draft, verify = step_of(deep["published"], ("draft", batch)), step_of(deep["published"], ("verify", batch, gamma))
    spread = sum_interval(((gamma * draft_added / added, draft[4]), (1, verify[4])))
    value = (deeper[0] - pub[0]) / added
    composed = (value, value - (spread[0] - spread[1]), value + (spread[2] - spread[0]))
    return {**empty, "per_layer_loop_ms": loop_layer[0], "per_layer_composed_ms": value,
            **_error("per_layer_error", composed, loop_layer, goal)}
