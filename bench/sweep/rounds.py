"""A run in rounds: every (case, impl) measured once per round, each round in a worker process of its own and in an
order of its own, and the rounds of a row combined into one row with the interval a repeat of the run lands in."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..spec.between_runs import latencies_text, repeat_interval, run_figure, run_interval
from ..spec.interval import outlier_count, percentile
from ..spec.roof_verdict import judged, judged_at_moments, speed_figures, with_ceiling_load
from ..spec.schema import cell_float
from .results import row_key

SHARED_TOTAL = 256 << 20  # the references a run keeps for its later rounds, in bytes at most
# a status that any one round has makes the row's (the first such round names it in the reason): a wrong output in
# one process is a wrong kernel, whatever the others gave
WORSE = ("incorrect", "failed")


def round_order(plan: Sequence[tuple], k: int, seed: str) -> list[tuple]:
    """The plan [(case, impls)] in the order of round k: the plan's own for the first round, then the cases and each
    case's impls shuffled with a generator seeded by the run and the round (random interleaving: a moment of the
    machine falls on other rows each round; a case keeps its impls together, which share its inputs)."""
    if k == 0:
        return list(plan)
    rng = random.Random(f"{seed}/{k}")
    order = [(case, rng.sample(list(impls), len(impls))) for case, impls in plan]
    rng.shuffle(order)
    return order


@dataclass
class RowRounds:
    """The rounds of one (case, impl): each round's row as measure() gave it, when it ran (epoch seconds), its round,
    the moments around it and whether it was measured again at the end of the run (a noisy round retried)."""

    rows: list[dict] = field(default_factory=list)
    at: list[float] = field(default_factory=list)
    index: list[int] = field(default_factory=list)  # the round each came from (a noisy round retried keeps its own)
    bracket: list[int] = field(default_factory=list)  # it ran between moments bracket and bracket + 1
    retried: list[bool] = field(default_factory=list)

    def add(self, row: dict, at: float, k: int, bracket: int, retried: bool = False) -> None:
        if k in self.index:  # a retry of that round takes its place
            where = self.index.index(k)
            self.rows[where], self.at[where], self.bracket[where], self.retried[where] = row, at, bracket, retried
            return
        self.rows.append(row)
        self.at.append(at)
        self.index.append(k)
        self.bracket.append(bracket)
        self.retried.append(retried)

    def combined(self, moments: list[dict]) -> dict:
        """The row of all its rounds (combine), judged at the moments around the rounds it pools: each round's 95%
        interval, or where it has too few samples for one (a later round's four), the extremes of its samples."""
        row, used = combine(self.rows, self.index, self.retried)
        spans = [(self.bracket[i], *_round_span(self.rows[i]), self.at[i]) for i in used]
        if moments and spans and row["status"] == "ok":
            row = judged_at_moments(row, spans, moments)
        return with_notes(row)


def _round_span(row: dict) -> tuple[float, float, float]:
    """(median, low, high) of a round: its 95% interval, else its samples' extremes (the extremes of n samples hold
    the median with 1 - 2^(1 - n): 87.5% at four)."""
    low, high = cell_float(row.get("latency_ci_low_ms")), cell_float(row.get("latency_ci_high_ms"))
    samples = row.get("samples_ms") or ()
    if not (math.isfinite(low) and math.isfinite(high)) and samples:
        low, high = min(samples), max(samples)
    return cell_float(row["latency_ms"]), low, high


def with_notes(row: dict) -> dict:
    """The row with the rounds combine left out named in its reason, after whatever judged it said there."""
    left = row.pop("_left", ())
    return {**row, "reason": "; ".join(filter(None, [row.get("reason"), *(f"{w}: left out" for w in left)]))}


def combine(rows: Sequence[dict], index: Sequence[int] | None = None,
            retried: Sequence[bool] = ()) -> tuple[dict, list[int]]:
    """One row from the rows of its rounds, and the positions of the rounds it pools. The first round's that is
    incorrect or failed where one is (its reason naming the round). Else the ok rounds that ran as the first did (its
    backend and cache state: unlike rounds are never pooled, and the reason says which were left out): the run's
    figure is the geometric mean of their medians, each round (its process, its moment) counting once
    (bench.spec.between_runs.run_figure), with its 95% interval from the rounds' spread (run_interval) and the
    interval a repeat of the run lands in (latency_between_*); `rounds` and `round_latencies_ms` (each round's
    median in round order); the samples pooled (p20, p80, outliers); noisy where any round was, converged only where
    every round stopped on its target; max_rel_err the largest of the rounds'; recompiles their sum (the compile
    columns are the first round's, its cold compile). One round keeps its own median and
    interval. The rounds left out are in "_left" (not a column: with_notes names them in the reason)."""
    index = list(index) if index is not None else list(range(len(rows)))
    marks = list(retried) + [False] * (len(rows) - len(retried))
    for k, row in sorted(zip(index, rows, strict=True), key=lambda kr: kr[0]):
        if len(rows) > 1 and row["status"] in WORSE:
            return {**row, "rounds": len(rows), "reason": f"round {k + 1} of {len(rows)}: {row['reason']}"}, []
    ok = [i for i, row in enumerate(rows) if row["status"] == "ok"]
    if not ok:
        return {**rows[0], "rounds": 0, "round_latencies_ms": ""}, []
    base = rows[ok[0]]
    used = [i for i in ok if (rows[i].get("backend"), rows[i].get("cache_state")) == (base.get("backend"),
                                                                                      base.get("cache_state"))]
    left = [f"round {index[i] + 1} ran as {rows[i].get('backend')}"
            + (f" ({rows[i]['cache_state']})" if rows[i].get("cache_state") else "") for i in ok if i not in used]
    slots: list = [None] * (max(index) + 1)
    for i in used:
        slots[index[i]] = float(rows[i]["latency_ms"])
    found = {"rounds": len(used), "_left": left,
             "round_latencies_ms": latencies_text(slots, [marks[index.index(k)] if k in index else False
                                                          for k in range(len(slots))])}
    if len(used) == 1:
        return {**base, **found}, used
    medians = [float(rows[i]["latency_ms"]) for i in used]
    latency = run_figure(medians)
    low, high = run_interval(medians)
    next_low, next_high = repeat_interval(medians, latency)
    samples = [float(s) for i in used for s in rows[i].get("samples_ms") or ()]
    noisy = [(index[i], rows[i]) for i in used if rows[i].get("noisy")]
    out = {**base, **found, **speed_figures(base, latency),
           "latency_ci_low_ms": low, "latency_ci_high_ms": high, "latency_ci_rel": (high - low) / 2 / latency,
           "latency_between_low_ms": next_low, "latency_between_high_ms": next_high,
           "latency_between_rel": (next_high - next_low) / 2 / latency,
           "samples": len(samples), "samples_ms": samples, "outliers": outlier_count(samples),
           "noisy": bool(noisy), "noise_reason": "; ".join(f"{r['noise_reason']} (round {k + 1})" for k, r in noisy),
           "time": max(str(rows[i].get("time") or "") for i in used)}
    if samples:
        ordered = sorted(samples)
        out.update(latency_p20_ms=percentile(ordered, 20), latency_p80_ms=percentile(ordered, 80))
    warmups = [cell_float(rows[i].get("warmup_s")) for i in used]
    out.update(_stopping([rows[i] for i in used]), warmup_s=max((w for w in warmups if math.isfinite(w)),
                                                                default=math.nan))
    recompiles = [cell_float(rows[i].get("recompiles")) for i in used]
    if any(math.isfinite(r) for r in recompiles):  # a compiled impl's: every round's, summed
        out["recompiles"] = sum(r for r in recompiles if math.isfinite(r))
    errors = [cell_float(rows[i].get("max_rel_err")) for i in used]  # the worst of every round's judged calls
    out["max_rel_err"] = max((e for e in errors if math.isfinite(e)), default=math.nan)
    return judged(out), used


def _stopping(ok: Sequence[dict]) -> dict:
    """The rounds' sampling in the row's columns: converged where every round stopped on its target; drifting where
    any round's halves disagreed, the stop reason of the first round that did not stop on its target, and the halves
    of the round whose halves lie furthest apart (the pooled samples' halves would set one round against another)."""
    found = {"converged": all(bool(r.get("converged")) for r in ok)}
    if not any(r.get("stop_reason") for r in ok):
        return found
    drifting = [r for r in ok if r.get("drifting")]
    short = drifting or [r for r in ok if r.get("stop_reason") != "target"]
    found.update(drifting=bool(drifting), stop_reason=short[0]["stop_reason"] if short else "target")

    def apart(row: dict) -> float:
        first, second = cell_float(row.get("first_half_ms")), cell_float(row.get("second_half_ms"))
        return abs(math.log(second / first)) if first > 0 and second > 0 else -1.0

    widest = max(drifting or ok, key=apart)
    found.update({k: widest.get(k) for k in ("first_half_ms", "second_half_ms")})
    return found

class RoundBook:
    """What this invocation measured, for judging at the run's moments: the rounds of each row in combined rounds
    (by row key), or the keys of rows appended one per round; and the moments (before, each later round's probe,
    after)."""

    def __init__(self, moments: list[dict]):
        self.moments = moments
        self.rounds: dict[tuple, RowRounds] = {}
        self.appended: dict[tuple, list[float]] = {}  # when each appended row of a key ran, in the order written
        self._read: dict[tuple, int] = {}

    def append(self, key: tuple, at: float, replaces: bool = False) -> None:
        """An appended row of `key` that ran at `at` (epoch seconds); `replaces`: it took the place of the key's row."""
        self.appended[key] = [at] if replaces else [*self.appended.get(key, []), at]

    def add(self, key: tuple, row: dict, at: float, k: int, bracket: int | None = None, retried: bool = False) -> dict:
        """Round k's row of `key` (run between moments `bracket` and `bracket` + 1, by default k's; `retried`: measured
        again at the end of the run); returns the combined row of its rounds so far, judged at the moments known so
        far."""
        found = self.rounds.setdefault(key, RowRounds())
        found.add(row, at, k, k if bracket is None else bracket, retried)
        return found.combined(self.moments)

    def __contains__(self, key: tuple) -> bool:
        return key in self.rounds or key in self.appended

    def judged(self, key: tuple, row: dict) -> dict:
        """A stored row judged at the moments: a row of combined rounds from its rounds; an appended row from its own
        interval and time (its CSV text); a row this invocation did not measure as it was (an earlier invocation's
        moments judged it)."""
        if key in self.rounds:
            return self.rounds[key].combined(self.moments)
        if key not in self.appended:
            return row
        ats, seen = self.appended[key], self._read.get(key, 0)  # the stored rows of a key come in the order written
        self._read[key] = seen + 1
        if row.get("status") != "ok":
            return row
        span = (0, cell_float(row.get("latency_ms")), cell_float(row.get("latency_ci_low_ms")),
                cell_float(row.get("latency_ci_high_ms")), ats[min(seen, len(ats) - 1)])
        return judged_at_moments(row, [span], self.moments)


def rounds_rule(cfg) -> dict:
    """What run.json says of the rounds: how many, and how a run's rows are made of them."""
    if not cfg.combine_rounds:
        return {"combined": False, "rule": "each round appends its rows" if cfg.rounds > 1 else "one round"}
    return {"combined": True, "processes": cfg.isolation.isolate,
            "rule": ("each round after the first in a fresh worker process (--no-isolate: in this one), after a "
                     "probe of the ceilings, the cases and their impls shuffled (seeded by the run id and the round); "
                     "a row's latency is the geometric mean of its rounds' medians, its 95% interval Student's t "
                     "on their logs (t s / sqrt(R)), and latency_between_* the interval a repeat of the run lands "
                     "in (t s sqrt(2 / R)); its samples pool for the percentiles"),
            "repeated": "ok rows in compiled mode (an interpreter's single sample is not speed)"}


class SweepRounds:
    """The rounds of one sweep on the runner's executor and store: measure_one(case, impl, base) makes one row,
    base_of(case, impl) its base row; `book` keeps what each row's rounds gave, for the moments."""

    def __init__(self, cfg, executor, store, book: RoundBook, measure_one, base_of, before):
        self.cfg, self.executor, self.store, self.book = cfg, executor, store, book
        self.measure_one, self.base_of, self.before = measure_one, base_of, before
        self.noisy: list[tuple] = []  # (case, impl, base, round) timed on a busy machine: measured again at the end
        self.rounds_run = 0
        self.index = 0
        self.probe_failures: list[str] = []
        self.checked: dict = {}  # case -> its reference and baseline error from the first round (measure's shared)
        self.autotune_rounds: list = []  # the autotune winners of each round's worker before the last
        self.shared_bytes = 0

    def _shown(self, row: dict, total: int, k: int | None = None) -> None:
        self.index += 1
        if self.cfg.on_row:
            self.cfg.on_row({**row, "round": "" if k is None else f"{k + 1}/{self.cfg.rounds}"}, self.index, total)

    def appended(self, plan) -> int:
        """Each round appends a row per (case, impl), `between_rounds` around them; returns the rows measured."""
        cfg, fresh = self.cfg, 0
        total = cfg.rounds * sum(len(impls) for _, impls in plan)
        for k in range(cfg.rounds):
            if cfg.between_rounds:
                cfg.between_rounds(self.executor, k)
            for case, impls in plan:
                for impl in impls:
                    base = self.base_of(case, impl)
                    if k == 0 and self.store.is_done(base):
                        self.index += 1
                        continue
                    row = self._keep(self.measure_one(case, impl, base))
                    self.store.append(row)
                    self.book.append(row_key(row), row["_at"])
                    fresh += 1
                    if row["status"] == "ok" and row.get("noisy") and cfg.rounds == 1:
                        self.noisy.append((case, impl, base, 0))
                    self._shown(row, total, k if cfg.rounds > 1 else None)
            self.rounds_run = k + 1
        if cfg.between_rounds:
            cfg.between_rounds(self.executor, cfg.rounds)
        return fresh

    def combined(self, plan, seed: str) -> int:
        """Round after round, each after the first in a fresh worker after a probe of the ceilings, the rows that
        were ok and compiled in the first measured again in an order of their own, each (case, impl)'s row in the
        store replaced by the combination of its rounds so far; returns the rows measured."""
        cfg, fresh, again = self.cfg, 0, []
        total = sum(len(impls) for _, impls in plan)
        order = [row_key(self.base_of(case, impl)) for case, impls in plan for impl in impls]
        for k in range(cfg.rounds):
            if k:
                if not again:
                    break
                self.autotune_rounds.append(self.executor.autotune())  # each process tunes its own
                self.executor.restart()
                self._probe(f"round {k + 1}")
                total = self.index + len(again) * (cfg.rounds - k)
            for case, impls in round_order(plan if k == 0 else _regrouped(again), k, seed):
                for impl in impls:
                    base = self.base_of(case, impl)
                    if k == 0 and self.store.is_done(base):
                        self.index += 1
                        continue
                    known = {"_checked": self.checked[case]} if case in self.checked else {}
                    asked = {**base, "_again": True, **known} if k else {
                        **base, "_share": cfg.rounds > 1 and case not in self.checked}
                    row = self.measure_one(case, impl, asked)
                    if "_checked" in row:  # the first ok impl's: every later round of the case judges against them
                        self._keep_checked(case, row.pop("_checked"))
                    if row.get("refused") and k:
                        continue
                    if k == 0 and row["status"] == "ok" and row["mode"] == "compiled":
                        again.append((case, impl))
                    bracket = len(self.book.moments) - 1  # it runs after the latest measurement of the ceilings
                    combined = self._keep(self.book.add(row_key(base), row, row["_at"], k, bracket))
                    if k == 0:
                        self.store.append(combined)
                    else:
                        self.store.replace(combined)
                    fresh += 1
                    if row["status"] == "ok" and row.get("noisy"):
                        self.noisy.append((case, impl, base, k))
                    self._shown(row, total, k)
            self.rounds_run = k + 1
        self.store.reorder(order)  # the rows in the plan's order, as its first round wrote them
        return fresh

    def _keep_checked(self, case, checked: tuple) -> None:
        """A case's reference (an array, or None) and baseline error for its later rounds, the references held here at
        most SHARED_TOTAL bytes in all (past it a later round computes its own)."""
        reference, baseline = checked
        size = 0 if reference is None else reference.nbytes
        if self.shared_bytes + size > SHARED_TOTAL:
            reference, size = None, 0
        self.shared_bytes += size
        self.checked.setdefault(case, (reference, baseline))

    def _probe(self, name: str) -> None:
        """A moment of the run measured now (none where the host's kept ceilings judge every run); a probe that
        fails costs its moment only, and says so in run.json."""
        try:
            probed = self.executor.probe(self.before, name)
        except Exception as err:  # a worker that died probing: the rows of this round take the moments around it
            self.probe_failures.append(f"{name}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
            return
        if probed is not None:
            self.book.moments.append(probed)

    def retry_noisy(self, retries: int) -> dict:
        """Measure the noisy rounds again, up to `retries` times each, after the rest of the sweep (the machine may be
        quiet by then), in a fresh worker each time where rounds are combined: a quiet row replaces its noisy round
        (or its row); one still noisy keeps the first. Returns the counts for run.json."""
        noisy, quiet = list(self.noisy), 0
        for _ in range(retries if noisy else 0):
            still = []
            if self.cfg.combine_rounds:
                self.executor.restart()  # each retry round starts its own process, as the rounds did
            for case, impl, base, k in noisy:
                again = self.measure_one(case, impl, base)
                if again["status"] == "incorrect":  # a wrong output in any call makes the row wrong
                    if self.cfg.combine_rounds:
                        found = self.book.add(row_key(base), again, again["_at"], k, len(self.book.moments) - 1, True)
                    else:
                        found = again
                        self.book.append(row_key(again), again["_at"], replaces=True)
                    self.store.replace(self._keep(found))
                elif again["status"] == "ok" and not again.get("noisy"):
                    if self.cfg.combine_rounds:
                        key = row_key(base)
                        last = len(self.book.moments) - 1  # it runs after the last round's probe, before `after`
                        self.store.replace(self._keep(self.book.add(key, again, again["_at"], k, last, True)))
                    else:
                        self.store.replace(self._keep(again))
                        self.book.append(row_key(again), again["_at"], replaces=True)
                    quiet += 1
                else:
                    still.append((case, impl, base, k))
            noisy = still
        return {"rounds": retries, "noisy": len(self.noisy), "quiet_on_retry": quiet}

    def _keep(self, row: dict) -> dict:
        """The row as the store keeps it: its ceiling load named where it stands above its roof."""
        return with_ceiling_load(row, self.before)


def _regrouped(pairs: Sequence[tuple]) -> list[tuple]:
    """[(case, impl)] as [(case, [impls])], cases in their first order."""
    grouped: dict = {}
    for case, impl in pairs:
        grouped.setdefault(case, []).append(impl)
    return list(grouped.items())
