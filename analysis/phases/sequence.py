"""The sequence term (no torch): what one layer's ops (or the head's) cost called back to back beyond their sum alone,
from the turns of bench.phases.op_sequence; each shape's effect with its interval, pooled over the shapes of one phase
where that narrows it, and applied only where its interval excludes no effect.

Forms: `ratio` (the host): per turn, sequence / alone, so that a uniform drift between the sweep and the sequence
row cancels, and the term is (ratio - 1) x the sweep's sum of the same ops; `difference` (a GPU, where launch gaps
add rather than scale): per turn, sequence - alone in ms. sequences.csv written before the turns (one turn, no
form) keeps its difference as measured, with no interval (`legacy`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ...bench.spec import steps as step_defs
from ...bench.spec.interval import median_interval, overlap

FORMS = ("ratio", "difference")
LEGACY = "legacy"  # a sequence row from before the turns: sequence_ms - alone_ms of one turn
NULL = {"ratio": 1.0, "difference": 0.0, LEGACY: 0.0}  # the effect of no effect
# the sequence row's ops alone against the sweep's rows of the same ops (difference forms only: a ratio cancels a
# uniform drift): further apart than this, one of the two was disturbed, and their difference is no term
ALONE_AGREEMENT = 1.5
DECISION_COLUMNS = ("form", "turns", "effect", "effect_low", "effect_high", "pooled_shapes", "pooled_effect",
                    "pooled_low", "pooled_high", "basis", "applied_effect", "applied_low", "applied_high", "applied",
                    "why")


def sequence_parts(uses: list[step_defs.OpUse]) -> list[tuple[str, int, list[step_defs.OpUse]]]:
    """A step as its sequences: ("layer", layers, one layer's uses with per-layer counts) for each kind of layer
    (OpUse.group: a model whose layers differ has several), and ("head", 1, the head's uses), each present where the
    step has it. A layer runs each op once or twice, so the fewest runs are the layers."""
    groups: dict[str, list[step_defs.OpUse]] = {}
    for use in uses:
        if use.part != "head":
            groups.setdefault(use.group, []).append(use)
    out = []
    for layer in groups.values():
        layers = min(u.count for u in layer)
        out.append(("layer", layers, [dataclasses.replace(u, count=u.count // layers) for u in layer]))
    head = [u for u in uses if u.part == "head"]
    if head:
        out.append(("head", 1, head))
    return out


def sequence_key(uses: list[step_defs.OpUse]) -> str:
    """The name of a sequence of uses, the same wherever it is built (16 hex digits of its ops, fields and counts)."""
    text = "|".join(f"{u.op} {u.fields!r} x{u.count}" for u in uses)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def turn_effect(alone_ms: float, sequence_ms: float, form: str) -> float:
    """One turn's effect: sequence / alone (ratio) or sequence - alone (difference)."""
    return sequence_ms / alone_ms if form == "ratio" else sequence_ms - alone_ms


def effects_text(values) -> str:
    """Per-turn effects as sequences.csv keeps them: ';'-joined."""
    return ";".join(f"{v:.9g}" for v in values)


def _effects(text) -> list[float]:
    if not isinstance(text, str) or not text.strip():
        return []
    return [float(v) for v in text.split(";") if v.strip()]


def _flag(rows: pd.DataFrame, column: str) -> np.ndarray:
    if column not in rows.columns:
        return np.zeros(len(rows), dtype=bool)
    return rows[column].fillna(False).astype(str).str.lower().isin(("true", "1")).to_numpy()


def _excludes(low: float, high: float, null: float) -> bool:
    return math.isfinite(low) and math.isfinite(high) and (low > null or high < null)


def _width(low: float, high: float) -> float:
    return high - low if math.isfinite(low) and math.isfinite(high) else math.inf


def decisions(sequences: pd.DataFrame | None) -> pd.DataFrame:
    """sequences.csv with where each term is applied (DECISION_COLUMNS): each ok row's effect over its own turns with
    the 95% interval of their median; the pool of the turns of the quiet rows of the same kind (layer or head),
    phase and form whose own intervals meet the row's; the pooled effect used where each two members' intervals
    meet, the pool meets each and is narrower than the row's own (one effect, not several narrowed by their
    number); applied where that interval excludes no effect (1 for a ratio, 0 for a difference). Noisy rows are
    never applied; legacy rows are applied as measured, without an interval."""
    if sequences is None or not len(sequences) or "key" not in sequences:
        return pd.DataFrame(columns=["key", *DECISION_COLUMNS])
    table = sequences.copy().reset_index(drop=True)
    form = table["form"].fillna(LEGACY).astype(str) if "form" in table else pd.Series(LEGACY, index=table.index)
    table["form"] = form.where(form.isin(FORMS), LEGACY)
    ok, noisy = (table["status"] == "ok").to_numpy(), _flag(table, "noisy")
    turns = [_effects(t) for t in (table["turn_effects"] if "turn_effects" in table else [""] * len(table))]
    own = [median_interval(t) for t in turns]
    table["turns"] = [len(t) for t in turns]
    table["effect"] = [o.median for o in own]
    table["effect_low"], table["effect_high"] = [o.low for o in own], [o.high for o in own]
    legacy = (table["form"] == LEGACY).to_numpy()
    if legacy.any():
        diff = pd.to_numeric(table["sequence_ms"], errors="coerce") - pd.to_numeric(table["alone_ms"], errors="coerce")
        table.loc[legacy, "effect"] = diff[legacy]
    phase = table["phase"] if "phase" in table else pd.Series("", index=table.index)
    group = [(s, p, f) for s, p, f in zip(table["sequence"], phase, table["form"], strict=True)]
    pools: dict = {}
    for i, key in enumerate(group):
        if ok[i] and not noisy[i] and not legacy[i] and turns[i]:
            pools.setdefault(key, []).append(i)
    out = {name: [] for name in DECISION_COLUMNS if name not in ("form", "turns", "effect", "effect_low",
                                                                  "effect_high")}
    for i in range(len(table)):
        mine = own[i]
        # a pool assumes one effect: the shapes whose own intervals meet this one's, pooled only where each two of
        # them meet and the pool meets each (shapes of two effects would narrow it by their number alone)
        members = [j for j in pools.get(group[i], []) if overlap((mine.low, mine.high), (own[j].low, own[j].high))]
        pooled = median_interval([v for j in members for v in turns[j]]) if len(members) > 1 and i in members \
            else None
        ends = [(own[j].low, own[j].high) for j in members]
        one_effect = (pooled is not None and all(overlap(a, b) for a in ends for b in ends)
                      and all(overlap(a, (pooled.low, pooled.high)) for a in ends))
        use_pool = (one_effect and _width(pooled.low, pooled.high) < _width(mine.low, mine.high)
                    and overlap((mine.low, mine.high), (pooled.low, pooled.high)))
        chosen = pooled if use_pool else mine
        effect, low, high = ((float(table.loc[i, "effect"]), math.nan, math.nan) if legacy[i]
                             else (chosen.median, chosen.low, chosen.high))
        if not ok[i]:
            applied, why = False, "not measured"
        elif noisy[i]:
            applied, why = False, "noisy: left out"
        elif legacy[i]:
            applied, why = math.isfinite(effect), "one turn (a folder from before the turns): applied as measured"
        else:
            applied = _excludes(low, high, NULL[table.loc[i, "form"]])
            why = "its interval excludes no effect" if applied else "its interval holds no effect: not applied"
        out["pooled_shapes"].append(len(members) if pooled is not None else 0)
        out["pooled_effect"].append(pooled.median if pooled is not None else math.nan)
        out["pooled_low"].append(pooled.low if pooled is not None else math.nan)
        out["pooled_high"].append(pooled.high if pooled is not None else math.nan)
        out["basis"].append(f"pooled over {len(members)} shapes" if use_pool else
                            "one turn" if legacy[i] else f"its own {len(turns[i])} turns")
        out["applied_effect"].append(effect)
        out["applied_low"].append(low)
        out["applied_high"].append(high)
        out["applied"].append(bool(applied))
        out["why"].append(why)
    for name, values in out.items():
        table[name] = values
    return table


@dataclass(frozen=True)
class Term:
    """One sequence's decision: its form, the effect applied with its interval (NaN ends: none), whether it is
    applied, whether it was noisy, and its ops' time alone in its own row (for the difference forms' agreement)."""

    form: str
    effect: float
    low: float
    high: float
    applied: bool
    noisy: bool
    alone_ms: float

    def ms(self, swept_ms: float) -> tuple[float, float, float]:
        """The term in ms beside the sweep's sum of the same ops (swept_ms), with its interval: (ratio - 1) x swept
        for a ratio, the effect itself for a difference."""
        if self.form == "ratio":
            return tuple((v - 1.0) * swept_ms for v in (self.effect, self.low, self.high))
        return self.effect, self.low, self.high

    def agrees(self, swept_ms: float) -> bool:
        """A difference is added to the sweep's sum: it holds only where the row's ops alone took about what the
        sweep's rows say (a ratio cancels a uniform drift and needs no such rule)."""
        if self.form == "ratio":
            return True
        return swept_ms > 0 and 1 / ALONE_AGREEMENT <= self.alone_ms / swept_ms <= ALONE_AGREEMENT


def terms(sequences: pd.DataFrame | None) -> dict[str, Term]:
    """key -> Term of the ok rows of sequences.csv (decisions made)."""
    table = decisions(sequences)
    table = table[table["status"] == "ok"] if len(table) else table
    noisy = _flag(table, "noisy")
    alone = pd.to_numeric(table["alone_ms"], errors="coerce") if "alone_ms" in table else pd.Series(dtype=float)
    return {key: Term(form, float(e), float(lo), float(hi), bool(a), bool(n), float(al))
            for key, form, e, lo, hi, a, n, al in zip(table["key"], table["form"], table["applied_effect"],
                                                       table["applied_low"], table["applied_high"], table["applied"],
                                                       noisy, alone, strict=True)}
