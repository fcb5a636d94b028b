"""The phase model's check against real forward passes (no torch): what is checked, the error of the published
composition (the ops/ rows) beside that of the interleaved rounds (check/), the per-layer error from references of
L and 2L layers (their difference removes the head), the head's share, and the goal a figure must meet."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ...bench.spec import steps as step_defs
from ...bench.spec.interval import error_interval, median_interval, noisy_verdict, sum_interval, verdict, worst_verdict
from ...bench.spec.models import DecoderConfig, config_from_dict
from . import model as pm
from .coverage import left_out

# The largest |error| a published figure may carry, per device kind. The host: one op's time varies by ~15% between
# calls on a shared 2-core host, so a tighter goal would judge the noise. A GPU: CUDA events time each op to about 1%
# and a real pass adds launch gaps the step's overhead term measures, so 10% leaves room for neither being hidden.
GOAL_PCT = {"cpu": 15.0, "cuda": 10.0}
BUSY = "busy in"  # a noise reason of a busy machine, which slows every bracket alike: no verdict on it at all
SPREAD_PCT = 10.0  # the rounds' (or brackets') errors with an interquartile range above this: they disagree


def goal_pct(device) -> float:
    """The goal for a device name ('cpu', 'cuda', 'cuda:1', ...): any accelerator takes the GPU goal."""
    kind = str(device or "cpu").split(":")[0].strip().lower()
    return GOAL_PCT["cpu"] if kind == "cpu" else GOAL_PCT["cuda"]


@dataclass(frozen=True)
class ReferencePlan:
    """What the check times: a prefill of `prompt` tokens (batch 1) and a decode step at `context` for each of
    `batches`, through `layers` layers and through twice as many (the per-layer check), with each implementation in
    `kinds`."""

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

    @property
    def scenarios(self) -> list[tuple[str, int, int]]:
        """(phase, batch, tokens): tokens is the prompt of a prefill, the context of a decode step."""
        return [("prefill", 1, self.prompt), *(("decode", b, self.context) for b in self.batches)]

    @property
    def depths(self) -> tuple[int, int]:
        """The layer counts each reference is timed at: L (the step's check) and 2L (the per-layer check)."""
        return self.layers, 2 * self.layers

    def cut(self, layers: int | None = None) -> DecoderConfig:
        """The model cut to `layers` layers (default: the check's L)."""
        return dataclasses.replace(self.model, layers=layers or self.layers)

    @property
    def small(self) -> DecoderConfig:
        return self.cut()

    def composed(self, measured: pm.Measured, phase: str, batch: int, tokens: int,
                 layers: int | None = None) -> pm.StepTime:
        """The composition of one scenario from measured rows, through `layers` layers (default L)."""
        if phase == "prefill":
            return pm.ttft(measured, self.cut(layers), tokens)
        return pm.tpot(measured, self.cut(layers), batch, tokens, self.page_size)

    def uses(self) -> list[step_defs.OpUse]:
        """Every op the scenarios' compositions sum, once (the same cases at any layer count)."""
        steps = [step_defs.prefill_step(self.small, self.prompt),
                 *(step_defs.decode_step(self.small, b, self.context, self.page_size) for b in self.batches)]
        return step_defs.distinct_uses(step_defs.with_weights(step, self.weights) for step in steps)


def _median(rows: list[dict]) -> float:
    samples = [s for r in rows for s in r.get("samples_ms", ())]
    return float(np.median(samples)) if samples else float("nan")


def _interval(rows: list[dict]) -> tuple[float, float, float]:
    """The median of the rows' pooled samples with its 95% interval."""
    found = median_interval([s for r in rows for s in r.get("samples_ms", ())])
    return found.median, found.low, found.high


def per_layer_interval(shallow: tuple, deep: tuple, layers_apart: int) -> tuple[float, float, float]:
    """(deep - shallow) / layers_apart with its interval: two independent medians' difference."""
    return sum_interval(((1 / layers_apart, deep), (-1 / layers_apart, shallow)))


def error_columns(prefix: str, composed: tuple, measured: tuple, goal: float) -> dict:
    """{prefix_error_pct, _low_pct, _high_pct, prefix_verdict}: a composed figure's error against a measured one with
    its interval, and within / over / unresolved against the goal."""
    error, low, high = error_interval(composed, measured)
    if not np.isfinite(error):
        error = pm.model_error(composed[0], measured[0])
    return {f"{prefix}_error_pct": error, f"{prefix}_error_low_pct": low, f"{prefix}_error_high_pct": high,
            f"{prefix}_verdict": verdict(low, high, goal)}


def _spread(errors: list[float]) -> float:
    return float(np.subtract(*np.percentile(errors, [75, 25]))) if errors else 0.0


def _composed(plan: ReferencePlan, measured: pm.Measured | None, phase: str, batch: int, tokens: int,
              layers: int | None = None) -> pm.StepTime | None:
    return None if measured is None else plan.composed(measured, phase, batch, tokens, layers)


def _total(step: pm.StepTime | None) -> float:
    return float("nan") if step is None else step.total_ms


def per_layer_ms(shallow_ms: float, deep_ms: float, shallow: int, deep: int) -> float:
    """One layer's time from two depths of the same pass: (t(deep) - t(shallow)) / (deep - shallow); whatever runs
    once per pass (the head, the embedding, a step's fixed cost) cancels."""
    return (deep_ms - shallow_ms) / (deep - shallow)


def _per_layer_error(plan: ReferencePlan, measured: pm.Measured | None, phase: str, batch: int, tokens: int,
                     reference_ms: float) -> tuple[float, float]:
    """(composed per-layer ms, its error against reference_ms) of one composition."""
    shallow, deep = plan.depths
    composed = per_layer_ms(_total(_composed(plan, measured, phase, batch, tokens, shallow)),
                            _total(_composed(plan, measured, phase, batch, tokens, deep)), shallow, deep)
    return composed, pm.model_error(composed, reference_ms)


def check_table(brackets: list[dict], plan: ReferencePlan, *, published: pm.Measured | None,
                interleaved: pm.Measured | None = None, per_round: list[pm.Measured] = (),
                ops_alone: pm.Measured | None = None) -> pd.DataFrame:
    """One row per (reference, phase, batch) of the brackets (each a dict with reference, bracket, phase, batch, tokens,
    layers (L or 2L; L where absent), samples_ms, noisy, noise_reason or error):

    - reference_ms: the median of every bracket's samples at L layers; published_composed_ms / published_error_pct:
      the composition of L layers from the published rows (ops/); interleaved_composed_ms / interleaved_error_pct:
      from each op's median over the check's rounds (check/); each round against its two brackets
      (round_error_min_pct, round_error_max_pct); head_share_pct: the head's share of the published composition;
    - deep_reference_ms at 2L layers; per_layer_reference_ms = (deep - L-layer reference) / L;
      per_layer_composed_ms and per_layer_error_pct from the published rows the same way (the head cancels), and
      per_layer_interleaved_error_pct from the rounds'; per_layer_ops_alone_error_pct from `ops_alone` (the
      published rows without the sequence term: what the composition reads without it), and sequence_pct, the
      sequence term's share of the published composition;
    - each figure with its 95% interval (reference_low/high_ms from the brackets' pooled samples, published_low/
      high_ms propagated from the ops' rows, the errors' *_low_pct / *_high_pct from both sides); published_verdict
      and per_layer_verdict: within the device's goal, over it, or unresolved where the error's interval straddles
      it; verdict: over if either is, within if both are; over_goal: verdict over.

    Errors are negative where the composition is faster than the real pass. A row is noisy when the rounds' errors
    (or the brackets' per-layer errors) have an interquartile range above SPREAD_PCT points, or when most brackets
    saw a busy machine; drift_pct says how far the reference moved from the first bracket to the last."""
    shallow, deep = plan.depths
    goal = goal_pct(plan.device)
    rows = []
    for key in dict.fromkeys((b["reference"], b["phase"], b["batch"], b["tokens"]) for b in brackets):
        kind, phase, batch, tokens = key
        mine = sorted((b for b in brackets if (b["reference"], b["phase"], b["batch"], b["tokens"]) == key),
                      key=lambda b: b["bracket"])
        timed = [b for b in mine if b.get("ms") and b.get("layers", shallow) == shallow]
        deeper = [b for b in mine if b.get("ms") and b.get("layers") == deep]
        samples = [s for b in timed for s in b.get("samples_ms", ())]
        reference, deep_ref = _interval(timed), _interval(deeper)
        reference_ms, deep_ms = reference[0], deep_ref[0]
        errors = []
        for k, round_rows in enumerate(per_round):
            around = _median([b for b in timed if b["bracket"] in (k, k + 1)])
            errors.append(pm.model_error(plan.composed(round_rows, phase, batch, tokens).total_ms, around))
        errors = [e for e in errors if np.isfinite(e)]
        step = _composed(plan, published, phase, batch, tokens)
        layer_ref = per_layer_ms(reference_ms, deep_ms, shallow, deep)
        layer_composed, layer_error = _per_layer_error(plan, published, phase, batch, tokens, layer_ref)
        _, layer_interleaved = _per_layer_error(plan, interleaved, phase, batch, tokens, layer_ref)
        _, layer_alone = _per_layer_error(plan, ops_alone, phase, batch, tokens, layer_ref)
        by_bracket = {b["bracket"]: b["ms"] for b in timed}
        layer_errors = [pm.model_error(layer_composed, per_layer_ms(by_bracket[b["bracket"]], b["ms"], shallow, deep))
                        for b in deeper if b["bracket"] in by_bracket]
        layer_errors = [e for e in layer_errors if np.isfinite(e)]
        reasons = _noise(timed + deeper, errors, layer_errors)
        published_errors = [e for e in (pm.model_error(_total(step), b["ms"]) for b in timed) if np.isfinite(e)] \
            if step is not None else []
        shown = error_columns("published", step.interval if step is not None else (np.nan,) * 3, reference, goal)
        layer_ref_ci = per_layer_interval(reference, deep_ref, deep - shallow)
        deep_step = _composed(plan, published, phase, batch, tokens, deep) if step is not None else None
        layer_composed_ci = deep_step.added_interval(step, deep - shallow) if deep_step is not None else (np.nan,) * 3
        per_layer = error_columns("per_layer", (layer_composed, *layer_composed_ci[1:]), layer_ref_ci, goal)
        ends = {name: (min(e), max(e)) if e else (np.nan, np.nan)
                for name, e in (("published", published_errors), ("per_layer", layer_errors))}
        if reasons:  # disagreeing brackets: over only where every bracket is; a busy machine: unresolved
            busy = any(r.startswith(BUSY) for r in reasons)
            for name, columns in (("published", shown), ("per_layer", per_layer)):
                columns[f"{name}_verdict"] = "unresolved" if busy else noisy_verdict(columns[f"{name}_verdict"],
                                                                                     *ends[name], goal)
        judged = worst_verdict(v for v, e in ((shown["published_verdict"], shown["published_error_pct"]),
                                              (per_layer["per_layer_verdict"], layer_error)) if np.isfinite(e))
        interleaved_ms = _total(_composed(plan, interleaved, phase, batch, tokens))
        head = step.parts.get("head", float("nan")) if step is not None and step.complete else float("nan")
        in_sequence = float(step.items.loc[step.items["op"] == "sequence", "ms"].sum()) if np.isfinite(head) \
            else float("nan")
        rows.append({
            "reference": kind, "implementation": next((b["implementation"] for b in timed), ""), "phase": phase,
            "layers": shallow, "batch": batch, "tokens": tokens, "reference_ms": reference_ms,
            "reference_low_ms": reference[1], "reference_high_ms": reference[2],
            "reference_p20_ms": float(np.percentile(samples, 20)) if samples else float("nan"),
            "reference_p80_ms": float(np.percentile(samples, 80)) if samples else float("nan"),
            "samples": len(samples), "brackets": len(timed), "rounds": len(per_round),
            "drift_pct": pm.model_error(timed[-1]["ms"], timed[0]["ms"]) if len(timed) > 1 else float("nan"),
            "published_composed_ms": _total(step),
            "published_composed_low_ms": step.low_ms if step is not None else np.nan,
            "published_composed_high_ms": step.high_ms if step is not None else np.nan, **shown,
            "interleaved_composed_ms": interleaved_ms,
            "interleaved_error_pct": pm.model_error(interleaved_ms, reference_ms),
            "round_error_min_pct": min(errors) if errors else float("nan"),
            "round_error_max_pct": max(errors) if errors else float("nan"),
            "head_share_pct": 100 * head / _total(step) if np.isfinite(head) else float("nan"),
            "deep_layers": deep, "deep_reference_ms": deep_ms, "per_layer_reference_ms": layer_ref,
            "per_layer_composed_ms": layer_composed, **per_layer,
            **{f"{name}_bracket_{end}_pct": value for name, pair in ends.items()
               for end, value in zip(("min", "max"), pair, strict=True)},
            "per_layer_interleaved_error_pct": layer_interleaved, "per_layer_ops_alone_error_pct": layer_alone,
            "sequence_pct": 100 * in_sequence / _total(step),
            "goal_pct": goal, "verdict": judged, "over_goal": judged == "over",
            "noisy": bool(reasons), "noise_reason": "; ".join(reasons),
            "error": next((b["error"] for b in mine if b.get("error")), ""),
            "left_out": left_out(plan.model, kind)})
    return pd.DataFrame(rows)


def _noise(timings: list[dict], errors: list[float], layer_errors: list[float]) -> list[str]:
    """Why a row is not believable: most of its timings on a busy machine, rounds or brackets that disagree."""
    reasons = []
    busy = [b for b in timings if b.get("noisy")]
    if timings and 2 * len(busy) > len(timings):
        reasons.append(f"{BUSY} {len(busy)} of {len(timings)} timings ({busy[0].get('noise_reason', '')})")
    if _spread(errors) > SPREAD_PCT:
        reasons.append(f"the rounds disagree: errors {min(errors):+.0f}% to {max(errors):+.0f}%, interquartile "
                       f"range {_spread(errors):.0f} points")
    if _spread(layer_errors) > SPREAD_PCT:
        reasons.append(f"the brackets' per-layer errors disagree: {min(layer_errors):+.0f}% to "
                       f"{max(layer_errors):+.0f}%, interquartile range {_spread(layer_errors):.0f} points")
    return reasons


def over_goal(published_error_pct: float, per_layer_error_pct: float, goal: float) -> bool:
    """Whether either error's point is beyond the goal (a missing error judges nothing): a table from before the
    intervals, read without a verdict."""
    return any(np.isfinite(e) and abs(e) > goal for e in (published_error_pct, per_layer_error_pct))


# ---------------------------------------------------------------- tables of any age

ERRORS = ("published_error_pct", "interleaved_error_pct", "per_layer_error_pct")
FILLED = ("published_composed_ms", "published_error_pct", "interleaved_composed_ms", "interleaved_error_pct",
          "head_share_pct", "deep_layers", "deep_reference_ms", "per_layer_reference_ms", "per_layer_composed_ms",
          "per_layer_error_pct", "per_layer_interleaved_error_pct", "per_layer_ops_alone_error_pct", "sequence_pct",
          "reference_low_ms", "reference_high_ms", "published_composed_low_ms", "published_composed_high_ms",
          "published_error_low_pct", "published_error_high_pct", "per_layer_error_low_pct", "per_layer_error_high_pct",
          "published_bracket_min_pct", "published_bracket_max_pct", "per_layer_bracket_min_pct",
          "per_layer_bracket_max_pct")


def normalised(table: pd.DataFrame, device=None) -> pd.DataFrame:
    """A reference table of any age in today's columns. Written with the interleaved rounds but before the
    published error (it has `rounds`): its composed_ms / error_pct are the rounds' (interleaved_*). Written before
    the rounds: they are the ops/ rows', the published composition (published_*). Columns it lacks are NaN; goal_pct
    (from `device` where the table has none) and over_goal are filled."""
    table = table.copy()
    if "published_error_pct" not in table and {"composed_ms", "error_pct"} <= set(table):
        kind = "interleaved" if "rounds" in table else "published"
        table = table.rename(columns={"composed_ms": f"{kind}_composed_ms", "error_pct": f"{kind}_error_pct"})
    for column in FILLED:
        if column not in table:
            table[column] = np.nan
        table[column] = pd.to_numeric(table[column], errors="coerce")
    goal = goal_pct(device)
    table["goal_pct"] = pd.to_numeric(table["goal_pct"], errors="coerce").fillna(goal) if "goal_pct" in table \
        else goal
    judged = []  # the three verdicts from the errors' intervals; a table from before them: unresolved
    for row in table.to_dict("records"):
        noisy = str(row.get("noisy")).strip().lower() in ("true", "1", "1.0")
        found = {name: verdict(row[f"{name}_error_low_pct"], row[f"{name}_error_high_pct"], row["goal_pct"])
                 for name in ("published", "per_layer")}
        if noisy:  # over only where every bracket is past the goal too (a table without the brackets: unresolved)
            busy = str(row.get("noise_reason", "")).startswith(BUSY)
            found = {n: noisy_verdict("unresolved" if busy else v, row[f"{n}_bracket_min_pct"],
                                      row[f"{n}_bracket_max_pct"], row["goal_pct"]) for n, v in found.items()}
        judged.append((*found.values(), worst_verdict(v for name, v in found.items()
                                                      if np.isfinite(row[f"{name}_error_pct"]))))
    for k, name in enumerate(("published_verdict", "per_layer_verdict", "verdict")):
        table[name] = [j[k] for j in judged] if judged else pd.Series(dtype=str)
    table["over_goal"] = table["verdict"] == "over"
    return table


def recomposed(table: pd.DataFrame, ops: pd.DataFrame, meta: dict) -> pd.DataFrame:
    """A normalised table without the published error, given it from the folder's ops/ rows (the published
    composition) against the same reference_ms; the per-layer error needs the 2L reference, which such a folder
    never timed."""
    missing = table["published_error_pct"].isna() & table["reference_ms"].notna()
    if not missing.any() or not len(ops):
        return table
    plan = plan_of(meta)
    measured = pm.Measured(ops, model=plan.model.name, dtype=plan.dtype, impls=meta.get("impls"))
    table = table.copy()
    for index in table.index[missing]:
        row = table.loc[index]
        step = plan.composed(measured, row["phase"], int(row["batch"]), int(row["tokens"]), int(row["layers"]))
        table.loc[index, "published_composed_ms"] = step.total_ms
        table.loc[index, "published_error_pct"] = pm.model_error(step.total_ms, float(row["reference_ms"]))
        if step.complete:
            table.loc[index, "head_share_pct"] = 100 * step.parts["head"] / step.total_ms
    return normalised(table, meta.get("device"))


def plan_of(meta: dict) -> ReferencePlan:
    """The check a phases.json describes."""
    model, impls = config_from_dict(meta["model"]), meta.get("impls") or {}
    return ReferencePlan(model, int(meta["reference_layers"]), str(meta.get("device", "cpu")),
                         str(meta["dtype"]), int(meta["chunk_prompt"]), tuple(meta["reference_batches"]),
                         int(meta["context"]), tuple(meta.get("references") or ("phasebench",)),
                         int(meta.get("page_size") or 0), moe_impl=impls.get("moe", "torch"),
                         attention_impl=impls.get("attention", "flash"), mla_impl=impls.get("mla", "torch"))


def where(row) -> str:
    """'prefill' or 'decode batch 8'."""
    return str(row["phase"]) if row["phase"] == "prefill" else f"{row['phase']} batch {int(row['batch'])}"


VERDICT_WORDS = {"within": "within goal", "over": "OVER GOAL", "unresolved": "unresolved"}


def verdict_notes(table: pd.DataFrame, which: str = "over") -> list[str]:
    """One line per row of that verdict: 'phasebench decode batch 1: per-layer error -21.0% [-30.2%, -17.0%], over
    the 15% goal' (unresolved: the errors whose intervals straddle the goal, or have none)."""
    out = []
    if "verdict" not in table:
        return out
    for row in table[table["verdict"] == which].to_dict("records"):
        said = [f"{label} " + pct_interval(*(row[f"{name}_error{end}_pct"] for end in ("", "_low", "_high")))
                for name, label in (("published", "published error"), ("per_layer", "per-layer error"))
                if row.get(f"{name}_verdict") == which and np.isfinite(row[f"{name}_error_pct"])]
        noisy = " (noisy)" if bool(row.get("noisy")) else ""
        how = "over" if which == "over" else "unresolved against"
        out.append(f"{row.get('reference', 'phasebench')} {where(row)}: {', '.join(said)}, {how} the "
                   f"{row['goal_pct']:g}% goal{noisy}")
    return out


def over_goal_notes(table: pd.DataFrame) -> list[str]:
    """The rows whose verdict is over (verdict_notes)."""
    return verdict_notes(table, "over")


def _pct(value) -> str:
    return f"{value:+.1f}%"


def pct_interval(value, low, high) -> str:
    """'-13.0% [-20.1%, -5.2%]' (no brackets where the interval is unknown)."""
    ends = f" [{low:+.1f}%, {high:+.1f}%]" if np.isfinite(low) and np.isfinite(high) else ""
    return _pct(value) + ends


def check_sentence(table: pd.DataFrame, phase: str, legend: bool = True) -> str:
    """What the check says of one phase's published figures, for beside them: 'Checked against real passes (goal
    15%; < 0: the composition is faster; [95% interval]): phasebench (2 layers) decode batch 1 published -3.2%
    [-9.0%, +2.1%] (interleaved -5.0%, per layer -21.0% [-30.2%, -17.0%]) OVER GOAL; decode batch 8 ...'; empty
    where nothing checked the phase. legend=False leaves out what the sign means (said once already)."""
    rows = table[table["phase"] == phase] if "phase" in table else table.iloc[:0]
    if not len(rows):
        return ""
    cells, named = [], set()
    for row in rows.to_dict("records"):
        values = {label: (float(row[column]), float(row.get(f"{column[:-4]}_low_pct", np.nan)),
                          float(row.get(f"{column[:-4]}_high_pct", np.nan)))
                  for column, label in (("published_error_pct", "published"),
                                        ("interleaved_error_pct", "interleaved"),
                                        ("per_layer_error_pct", "per layer"))}
        shown = [f"{label} {pct_interval(*value)}" for label, value in values.items() if np.isfinite(value[0])]
        who = f"{row.get('reference', 'phasebench')} ({int(row['layers'])} layers)"
        place = where(row) if who not in named else where(row).replace("decode batch", "batch")
        cell = ("" if who in named else f"{who} ") + f"{place} " + (  # each reference named once
            f"{shown[0]} ({', '.join(shown[1:])})" if len(shown) > 1 else (shown or ["not timed"])[0])
        named.add(who)
        cell += " noisy" if bool(row.get("noisy")) else ""
        cells.append(cell + " " + VERDICT_WORDS.get(str(row.get("verdict", "unresolved")), "unresolved"))
    goals = "/".join(f"{g:g}%" for g in dict.fromkeys(rows["goal_pct"]))
    sign = "; < 0: the composition is faster; [95% interval]" if legend else ""
    return f"Checked against real passes (goal {goals}{sign}): " + "; ".join(cells) + "."
