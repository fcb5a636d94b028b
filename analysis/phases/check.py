"""The phase model's check against real forward passes (no torch): each reference timed at 0, L and 2L layers in
brackets around rounds of the ops; per round, the composition of one layer against a real one ((t(2L) - t(0)) / 2L,
the head and whatever runs once per pass cancelled) and of the L-layer step against the L-layer pass; the error of the
published composition with the measured per-iteration cost; every error with an interval over its rounds."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ...bench.spec import steps as step_defs
from ...bench.spec.between_runs import S_FLOOR, repeat_interval, run_figure, run_interval, t_quantile
from ...bench.spec.interval import error_interval, sum_interval, verdict, worst_verdict
from ...bench.spec.models import DecoderConfig, config_from_dict
from . import model as pm
from .coverage import left_out

# The largest |error| a composed figure may carry, per device kind. The host: one op's time varies by ~15% between
# calls on a shared 2-core host, so a tighter goal would judge the noise. A GPU: CUDA events time each op to about 1%.
GOAL_PCT = {"cpu": 15.0, "cuda": 10.0}
# reference.csv: what a person reads; the rest of each row goes to reference_details.csv
# (error: the published L-layer composition; published_per_layer_error: one layer of the published rows, what speaks
# for the tables' full depth; per_layer_error: one layer of the check's own rounds of the ops, paired with the passes)
COLUMNS = ("reference", "phase", "batch", "tokens", "layers", "reference_ms", "composed_ms", "error_pct",
           "error_low_pct", "error_high_pct", "published_per_layer_error_pct", "published_per_layer_error_low_pct",
           "published_per_layer_error_high_pct", "per_layer_error_pct", "per_layer_error_low_pct",
           "per_layer_error_high_pct", "goal_pct", "verdict", "error")
KEYS = ("reference", "phase", "batch", "tokens")


def goal_pct(device) -> float:
    """The goal for a device name ('cpu', 'cuda', 'cuda:1', ...): any accelerator takes the GPU goal."""
    kind = str(device or "cpu").split(":")[0].strip().lower()
    return GOAL_PCT["cpu"] if kind == "cpu" else GOAL_PCT["cuda"]


@dataclass(frozen=True)
class ReferencePlan:
    """What the check times: a prefill of `prompt` tokens (batch 1) and a decode step at `context` for each of
    `batches`, through 0, `layers` and 2 x `layers` layers, with each implementation in `kinds`; and phasebench's
    decoder at 0 layers for each of `iteration_scenarios` (the published steps' per-iteration cost)."""

    model: DecoderConfig
    layers: int
    device: str
    dtype: str
    prompt: int
    batches: tuple[int, ...]
    context: int
    kinds: tuple[str, ...] = ("phasebench",)
    page_size: int = 0  # the composition's decode attention reads pages of this many tokens (0: contiguous)
    weights: str = ""  # the layers' projections packed by this scheme ("": the activation dtype)
    weights_impl: str = "torch"  # the qlinear impl that runs them, in the composition and the real pass alike
    moe_impl: str = "torch"  # a mixture's routed experts: the moe impl of the composition and of phasebench's pass
    attention_impl: str = "flash"  # window and sink layers' attention in phasebench's pass (the composition's impl)
    mla_impl: str = "torch"  # MLA's absorbed decode in phasebench's pass (the composition's mla impl)
    iteration_scenarios: tuple[tuple[str, int, int], ...] = ()  # (phase, batch, tokens) the tables publish
    experts: str = ""  # a mixture's routed experts packed by this scheme ("": the activation dtype)

    @property
    def scenarios(self) -> list[tuple[str, int, int]]:
        """(phase, batch, tokens): tokens is the prompt of a prefill, the context of a decode step."""
        return [("prefill", 1, self.prompt), *(("decode", b, self.context) for b in self.batches)]

    @property
    def depths(self) -> tuple[int, int, int]:
        """The layer counts each reference is timed at: 0 (what a step costs beyond its layers: the head and the
        per-iteration work), L (the step's check) and 2L (with 0, one layer's time)."""
        return 0, self.layers, 2 * self.layers

    @property
    def zero_layer_only(self) -> list[tuple[str, int, int]]:
        """The published scenarios the check does not time at every depth: phasebench's decoder at 0 layers only."""
        return [s for s in dict.fromkeys(self.iteration_scenarios) if s not in self.scenarios]

    def cut(self, layers: int | None = None) -> DecoderConfig:
        """The model cut to `layers` layers (default: the check's L)."""
        return dataclasses.replace(self.model, layers=self.layers if layers is None else layers)

    def composed(self, measured: pm.Measured, phase: str, batch: int, tokens: int,
                 layers: int | None = None) -> pm.StepTime:
        """The composition of one scenario's ops from measured rows, through `layers` layers (default L)."""
        if phase == "prefill":
            return pm.ttft(measured, self.cut(layers), tokens)
        return pm.tpot(measured, self.cut(layers), batch, tokens, self.page_size)

    def uses(self) -> list[step_defs.OpUse]:
        """Every op the scenarios' compositions sum at L and 2L layers, once (a mixture's first dense layers may hold
        all of the L-layer cut)."""
        steps = [step for layers in (self.layers, 2 * self.layers) for step in (
            step_defs.prefill_step(self.cut(layers), self.prompt),
            *(step_defs.decode_step(self.cut(layers), b, self.context, self.page_size) for b in self.batches))]
        return step_defs.distinct_uses(step_defs.with_weights(step, self.weights, self.experts) for step in steps)


def error_columns(prefix: str, composed: tuple, measured: tuple, goal: float) -> dict:
    """{prefix_error_pct, _low_pct, _high_pct, prefix_verdict}: a composed figure's error against a measured one with
    its interval, and within / over / unresolved against the goal."""
    error, low, high = error_interval(composed, measured)
    if not np.isfinite(error):
        error = pm.model_error(composed[0], measured[0])
    return {f"{prefix}_error_pct": error, f"{prefix}_error_low_pct": low, f"{prefix}_error_high_pct": high,
            f"{prefix}_verdict": verdict(low, high, goal)}


def paired_interval(ratios: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """The interval of the geometric mean of per-round ratios whose neighbours share a bracket (round k is set
    against brackets k and k + 1): Student's t with R - 1 degrees of freedom on a variance of the mean that adds the
    lag-1 autocovariance (Newey-West, Bartlett weight 1/2; never below the rounds taken as independent), the spread at
    least S_FLOOR. (NaN, NaN) under two rounds or with a ratio that is not positive."""
    if len(ratios) < 2 or not all(np.isfinite(r) and r > 0 for r in ratios):
        return math.nan, math.nan
    logs = np.log(np.asarray(ratios, dtype=float))
    d = logs - logs.mean()
    gamma0 = float(d @ d) / (len(d) - 1)
    gamma1 = float(d[1:] @ d[:-1]) / (len(d) - 1)
    var = max(gamma0 + max(gamma1, 0.0), S_FLOOR ** 2) / len(d)
    half = t_quantile(1 - (1 - confidence) / 2, len(d) - 1) * math.sqrt(var)
    return math.exp(logs.mean() - half), math.exp(logs.mean() + half)


def _ratio_columns(prefix: str, ratios: list[float], goal: float) -> dict:
    """An error from per-round ratios composed / measured: their geometric mean with paired_interval over the
    rounds, within / over / unresolved."""
    center = run_figure(ratios)
    low, high = paired_interval(ratios)
    ends = (100 * (low - 1), 100 * (high - 1))
    return {f"{prefix}_error_pct": 100 * (center - 1), f"{prefix}_error_low_pct": ends[0],
            f"{prefix}_error_high_pct": ends[1], f"{prefix}_verdict": verdict(*ends, goal)}


def _figure(values: list[float]) -> tuple[float, float, float]:
    """The geometric mean of positive values with its interval over them (NaN ends under two)."""
    return (run_figure(values), *run_interval(values))


def _timed(brackets: list[dict]) -> dict[tuple[int, int], float]:
    """(bracket, depth) -> the bracket's median ms (timed passes only)."""
    return {(b["bracket"], b["layers"]): b["ms"] for b in brackets if b.get("ms")}


def _around(ms: dict, k: int, depth: int) -> float:
    """The real pass around round k: the geometric mean of the brackets before and after it (one where the other is
    missing)."""
    found = [ms[(b, depth)] for b in (k, k + 1) if (b, depth) in ms]
    return run_figure(found) if found else math.nan


def _body(step: pm.StepTime) -> pm.StepTime:
    """A step's layers only (its items but those it runs once)."""
    items = step.items[~step.items["part"].isin(pm.ONCE)]
    return pm.StepTime(float(items["ms"].sum()), {}, items, step.missing)


def _ci(step: pm.StepTime) -> tuple[float, float, float]:
    """The published rows' composed step with the interval where a repeat lands: they were measured at another moment
    than the passes they are set against, and the drift between the two moments is in no interval of this run."""
    return pm.composed_interval(step.items)


def check_row(mine: list[dict], plan: ReferencePlan, published: pm.Measured | None,
              per_round: list[pm.Measured], goal: float) -> tuple[dict, dict]:
    """(the reference.csv row, the reference_details.csv row) of one reference and scenario (see check_table)."""
    kind, phase, batch, tokens = (mine[0][k] for k in KEYS)
    zero, shallow, deep = plan.depths
    ms = _timed(mine)
    by_depth = {d: [ms[(b, e)] for (b, e) in sorted(ms) if e == d] for d in plan.depths}
    reference, zero_pass = _figure(by_depth[shallow]), _figure(by_depth[zero])
    slopes = [(ms[(b, deep)] - ms[(b, zero)]) / deep for b in sorted({b for b, _ in ms})
              if (b, deep) in ms and (b, zero) in ms]
    layer_reference = _figure([s for s in slopes if s > 0])
    # per round: the round's ops against the passes around it (a drift moves both sides alike)
    step_ratios, layer_ratios = [], []
    for k, rows in enumerate(per_round):
        step = plan.composed(rows, phase, batch, tokens)
        real = {d: _around(ms, k, d) for d in plan.depths}
        deep_step = plan.composed(rows, phase, batch, tokens, deep)
        if step.missing or deep_step.missing or not all(np.isfinite(v) for v in real.values()):
            continue
        layer = _body(deep_step).total_ms / deep
        step_ratios.append((_body(step).total_ms + real[zero]) / real[shallow])
        if real[deep] > real[zero]:
            layer_ratios.append(layer / ((real[deep] - real[zero]) / deep))
    interleaved = _ratio_columns("interleaved", step_ratios, goal)
    per_layer = _ratio_columns("per_layer", layer_ratios, goal)
    # the published composition (ops/ rows): its layers, its head, and the per-iteration cost the passes measured
    step = plan.composed(published, phase, batch, tokens) if published is not None else None
    done = step is not None and step.complete
    head = step.parts.get("head", math.nan) if done else math.nan
    body = _ci(_body(step)) if done else (math.nan,) * 3
    composed = sum_interval(((1, body), (1, zero_pass))) if done else (math.nan,) * 3
    shown = error_columns("published", composed, reference, goal)
    deep_published = plan.composed(published, phase, batch, tokens, deep) if done else None
    layer_published = _ci(_body(deep_published)) if done and deep_published.complete else (math.nan,) * 3
    layer_shown = error_columns("published_per_layer", tuple(v / deep for v in layer_published), layer_reference,
                                goal)
    # every error judged, a missing one unresolved: a row without its per-layer rounds is never within
    judged = worst_verdict((shown["published_verdict"], per_layer["per_layer_verdict"],
                            layer_shown["published_per_layer_verdict"]))
    busy = [b for b in mine if b.get("ms") and b.get("noisy")]
    row = {"reference": kind, "phase": phase, "batch": batch, "tokens": tokens, "layers": shallow,
           "reference_ms": reference[0], "composed_ms": composed[0], "error_pct": shown["published_error_pct"],
           "error_low_pct": shown["published_error_low_pct"], "error_high_pct": shown["published_error_high_pct"],
           **{k: layer_shown[k] for k in ("published_per_layer_error_pct", "published_per_layer_error_low_pct",
                                          "published_per_layer_error_high_pct")},
           **{k: per_layer[k] for k in ("per_layer_error_pct", "per_layer_error_low_pct", "per_layer_error_high_pct")},
           "goal_pct": goal, "verdict": judged,
           "error": next((b["error"] for b in mine if b.get("error")), "")}
    details = {**{k: row[k] for k in KEYS}, "implementation": next((b.get("implementation") for b in mine
                                                                     if b.get("implementation")), ""),
               "rounds": len(layer_ratios), "iteration_ms": zero_pass[0] - head,
               "head_share_pct": 100 * head / composed[0] if done else math.nan,
               "reference_low_ms": reference[1], "reference_high_ms": reference[2],
               "zero_layer_ms": zero_pass[0], "head_ms": head, "composed_low_ms": composed[1],
               "composed_high_ms": composed[2], "published_verdict": shown["published_verdict"],
               "deep_layers": deep, "deep_reference_ms": _figure(by_depth[deep])[0],
               "per_layer_reference_ms": layer_reference[0], "per_layer_composed_ms": layer_published[0] / deep,
               "published_per_layer_verdict": layer_shown["published_per_layer_verdict"],
               "per_layer_verdict": per_layer["per_layer_verdict"], **interleaved,
               "round_step_errors": "/".join(f"{100 * (r - 1):+.1f}" for r in step_ratios),
               "round_per_layer_errors": "/".join(f"{100 * (r - 1):+.1f}" for r in layer_ratios),
               "drift_pct": pm.model_error(by_depth[shallow][-1], by_depth[shallow][0])
               if len(by_depth[shallow]) > 1 else math.nan,
               "brackets": len(by_depth[shallow]), "busy_brackets": len(busy),
               "rounds_dropped": len(per_round) - len(layer_ratios),  # an op or a pass missing, or t(2L) <= t(0)
               "slopes_dropped": len(slopes) - len([s for s in slopes if s > 0]),
               "samples": sum(len(b.get("samples_ms", ())) for b in mine if b.get("layers") == shallow),
               "left_out": left_out(plan.model, kind)}
    return row, details


def check_table(brackets: list[dict], plan: ReferencePlan, *, published: pm.Measured | None,
                per_round: list[pm.Measured] = ()) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(reference.csv, reference_details.csv): one row per (reference, phase, batch) of the brackets (each a dict
    with reference, bracket, phase, batch, tokens, layers (0, L or 2L), ms, samples_ms, or error).

    - per_layer_error_pct: per round of the ops (`per_round`), one layer of the composition (its 2L layers less
      its head, over 2L) against one real layer ((t(2L) - t(0)) / 2L of the passes in the brackets around that
      round); the geometric mean over the rounds with Student's t interval;
    - composed_ms and error_pct: the published composition (the `published` rows, the tables' own) of L layers plus
      the zero-layer pass (the head and the per-iteration work, measured), against the L-layer pass (the geometric
      mean of the brackets); its interval from the composition's rounds (or its rows' intervals) and the brackets';
      iteration_ms: the zero-layer pass less the composed head;
    - verdict: over where either error's interval is wholly past the goal, within where both are inside it,
      unresolved otherwise. The details add the interleaved step error (per round, as the per-layer one), the
      published rows' per-layer error, each round's errors, the drift and the brackets seen busy.

    Errors are negative where the composition is faster than the real pass."""
    goal = goal_pct(plan.device)
    rows, details = [], []
    for key in dict.fromkeys(tuple(b[k] for k in KEYS) for b in brackets):
        mine = sorted((b for b in brackets if tuple(b[k] for k in KEYS) == key and b.get("layers") is not None),
                      key=lambda b: b["bracket"])
        if {b.get("layers") for b in mine} <= {0} and any(b.get("ms") for b in mine):
            continue  # a published scenario timed at 0 layers only: iteration_costs
        row, detail = check_row(mine, plan, published, list(per_round), goal)
        rows.append(row)
        details.append(detail)
    return pd.DataFrame(rows, columns=list(COLUMNS)), pd.DataFrame(details)


def iteration_costs(brackets: list[dict], plan: ReferencePlan, published: pm.Measured) -> dict:
    """(phase, batch, tokens) -> (ms, low, high): phasebench's zero-layer pass of each published scenario (the
    geometric mean of its brackets, with its interval) less the head the published rows compose: what a step costs
    beyond its ops, added once per step (pm.Measured's iterations)."""
    out = {}
    for phase, batch, tokens in dict.fromkeys((*plan.scenarios, *plan.iteration_scenarios)):
        timed = [b["ms"] for b in brackets if b.get("ms") and b.get("layers") == 0 and b["reference"] == "phasebench"
                 and (b["phase"], b["batch"], b["tokens"]) == (phase, batch, tokens)]
        step = plan.composed(published, phase, batch, tokens)
        if not timed or step.missing:
            continue
        # the head cancels in head + iteration (= the zero-layer pass): the interval is the pass's, where a repeat lands
        zero, head = run_figure(timed), step.parts["head"]
        low, high = repeat_interval(timed, zero)
        out[(phase, batch, tokens)] = (zero - head, low - head, high - head)
    return out


def plan_of(meta: dict) -> ReferencePlan:
    """The check a phases.json describes."""
    model, impls = config_from_dict(meta["model"]), meta.get("impls") or {}
    return ReferencePlan(model, int(meta["reference_layers"]), str(meta.get("device", "cpu")),
                         str(meta["dtype"]), int(meta["chunk_prompt"]), tuple(meta["reference_batches"]),
                         int(meta["context"]), tuple(meta.get("references") or ("phasebench",)),
                         int(meta.get("page_size") or 0), str(meta.get("weights") or ""),
                         impls.get("qlinear", "torch"), moe_impl=impls.get("moe", "torch"),
                         attention_impl=impls.get("attention", "flash"), mla_impl=impls.get("mla", "torch"),
                         iteration_scenarios=(*(("prefill", 1, int(p)) for p in meta.get("prompts", ())),
                                              *(("decode", int(b), int(meta["context"]))
                                                for b in meta.get("batches", ()))),
                         experts=str(meta.get("experts") or ""))


def where(row) -> str:
    """'prefill' or 'decode batch 8'."""
    return str(row["phase"]) if row["phase"] == "prefill" else f"{row['phase']} batch {int(row['batch'])}"


VERDICT_WORDS = {"within": "within goal", "over": "OVER GOAL", "unresolved": "unresolved"}
ERRORS = (("error", "error"), ("published_per_layer_error", "published per layer"),
          ("per_layer_error", "check's per layer"))


def verdict_notes(table: pd.DataFrame, which: str = "over") -> list[str]:
    """One line per row of that verdict: 'phasebench decode batch 1: error -3.2% [-9.0%, +2.1%], per-layer error
    -21.0% [-30.2%, -17.0%]: over the 15% goal'."""
    out = []
    if "verdict" not in table:
        return out
    for row in table[table["verdict"] == which].to_dict("records"):
        said = [f"{label} {pct_interval(row[f'{name}_pct'], row[f'{name}_low_pct'], row[f'{name}_high_pct'])}"
                for name, label in ERRORS if np.isfinite(row[f"{name}_pct"])]
        how = "over" if which == "over" else "unresolved against"
        out.append(f"{row.get('reference', 'phasebench')} {where(row)}: {', '.join(said)}: {how} the "
                   f"{row['goal_pct']:g}% goal")
    return out


def verdict_counts(table: pd.DataFrame) -> dict:
    """How many rows each verdict has, and the unresolved share (a check that leaves most rows unresolved failed)."""
    counts = {v: int((table["verdict"] == v).sum()) for v in VERDICT_WORDS} if "verdict" in table else {}
    total = sum(counts.values())
    return {**counts, "unresolved_share": counts.get("unresolved", 0) / total if total else math.nan}


def pct_interval(value, low, high) -> str:
    """'-13.0% [-20.1%, -5.2%]' (no brackets where the interval is unknown)."""
    ends = f" [{low:+.1f}%, {high:+.1f}%]" if np.isfinite(low) and np.isfinite(high) else ""
    return f"{value:+.1f}%" + ends


def check_sentence(table: pd.DataFrame, phase: str, legend: bool = True) -> str:
    """What the check says of one phase's figures, for beside them: 'Checked against real passes (goal 15%; < 0: the
    composition is faster; [95% interval]): phasebench (2 layers) decode batch 1 -3.2% [-9.0%, +2.1%] (per layer
    -21.0% [-30.2%, -17.0%]) OVER GOAL; ...'; empty where nothing checked the phase. legend=False leaves out what the
    sign means (said once already)."""
    rows = table[table["phase"] == phase] if "phase" in table else table.iloc[:0]
    if not len(rows):
        return ""
    cells, named = [], set()
    for row in rows.to_dict("records"):
        shown = [f"{'' if name == 'error' else label + ' '}"
                 f"{pct_interval(row[f'{name}_pct'], row[f'{name}_low_pct'], row[f'{name}_high_pct'])}"
                 for name, label in ERRORS if np.isfinite(row[f"{name}_pct"])]
        who = f"{row.get('reference', 'phasebench')} ({int(row['layers'])} layers)"
        place = where(row) if who not in named else where(row).replace("decode batch", "batch")
        cell = ("" if who in named else f"{who} ") + f"{place} " + (
            f"{shown[0]} ({', '.join(shown[1:])})" if len(shown) > 1 else (shown or ["not timed"])[0])
        named.add(who)
        cells.append(cell + " " + VERDICT_WORDS.get(str(row.get("verdict", "unresolved")), "unresolved"))
    goals = "/".join(f"{g:g}%" for g in dict.fromkeys(rows["goal_pct"]))
    sign = "; < 0: the composition is faster; [95% interval]" if legend else ""
    return f"Checked against real passes (goal {goals}{sign}): " + "; ".join(cells) + "."
