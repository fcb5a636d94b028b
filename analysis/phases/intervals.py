"""A composed figure's interval: the rows measured in rounds move together, so their part takes the spread of its
per-round totals (where a repeat of the run lands, or this run's figure); the other rows add their within-run arms in
quadrature (no torch)."""

from __future__ import annotations

import pandas as pd

from ...bench.spec.between_runs import repeat_interval, round_slots, run_figure, run_interval
from ...bench.spec.interval import sum_interval


def in_turn(cell) -> tuple | None:
    """A row's per-round medians from its round_latencies_ms (bench.spec.between_runs), in round order; a round it
    lacks is filled with the geometric mean of its others, and one measured again at the end of the run (noisy in its
    turn) keeps that measurement in its place: one row's round is not worth every figure that reads it losing that
    round. None for a row of under two measured rounds."""
    slots = round_slots(cell)
    found = [s[0] for s in slots if s is not None]
    if len(slots) < 2 or len(found) < 2:
        return None
    filler = run_figure(found)
    return tuple(filler if s is None else s[0] for s in slots)


def round_totals(table: pd.DataFrame) -> list[float]:
    """Σ count x the round's median per round (in_turn) over the rows of `table` ([] where a row has no rounds, or the
    rows' round counts differ)."""
    if not len(table) or any(r is None for r in table["rounds"]):
        return []
    counts = {len(r) for r in table["rounds"]}
    if len(counts) != 1:
        return []
    totals = []
    for k in range(counts.pop()):
        values = [r[k] for r in table["rounds"]]
        if all(v is not None for v in values):
            totals.append(float(sum(c * v for c, v in zip(table["count"], values, strict=True))))
    return totals


def grouped_items(*items: pd.DataFrame) -> pd.DataFrame:
    """The items of one or several steps by row: a row read by several steps, or several times in one, once with
    its counts added."""
    table = pd.concat([t for t in items if len(t)], ignore_index=True) if any(len(t) for t in items) else None
    if table is None:
        return pd.DataFrame(columns=["count", "latency_ms", "low", "high", "rounds"])
    return table.groupby("key", sort=False).agg(count=("count", "sum"), latency_ms=("latency_ms", "first"),
                                                low=("latency_low_ms", "first"), high=("latency_high_ms", "first"),
                                                rounds=("rounds", "first"))


def _quadrature(rows: pd.DataFrame) -> tuple[float, float, float]:
    return sum_interval((c, (m, lo, hi)) for c, m, lo, hi in zip(rows["count"], rows["latency_ms"], rows["low"],
                                                                 rows["high"], strict=True))


def composed_interval(*items: pd.DataFrame, repeat: bool = True) -> tuple[float, float, float]:
    """The sum of count x latency over the items of one or several steps (grouped_items), with its interval. The rows
    measured in rounds move together (a drift moves every row of a round alike): their part takes the interval of the
    spread of its per-round totals, where a repeat of the run lands (`repeat`), or this run's figure (not `repeat`:
    bench.spec.between_runs); the other rows (one round, a measured per-iteration cost) add their arms in
    quadrature (bench.spec.interval.sum_interval)."""
    grouped = grouped_items(*items)
    if not len(grouped):
        return 0.0, 0.0, 0.0
    rounded = grouped["rounds"].map(lambda r: r is not None).to_numpy(bool)
    together = _quadrature(grouped[rounded])
    totals = round_totals(grouped[rounded])
    if len(totals) >= 2 and together[0] > 0:
        if repeat:
            low, high = repeat_interval(totals, together[0])
        else:  # this run's interval of the mean, centred on the figure
            low, high = (together[0] * end / run_figure(totals) for end in run_interval(totals))
        together = (together[0], low, high)
    return sum_interval(((1, together), (1, _quadrature(grouped[~rounded]))))
