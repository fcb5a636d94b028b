"""The headline: per device, mode, timer and dtype the best implementation of each op and phase, its share of
the measured roof and the bound; a phases folder's TTFT, TPOT and limits; the flagged rows counted."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...bench.spec.schema import CASE_FIELDS, cell_true, key_text
from ..figures.kit import (
    finding_rows,
    flag,
    interpreter,
    ok_rows,
    ordered_impls,
    ordered_ops,
    ordered_phases,
    performance_rows,
)
from ..phases.figures import reference_table, saturation_text
from .headline_text import GROUP_BY, Headline
from .tables import report_rows

COLUMNS = ("device", "mode", "timer", "profiled", "dtype", "op", "phase", "best_impl", "pct_roofline",
           "max_pct_roofline", "bound", "cases", "shared", "runner_up", "runner_up_pct", "speedup", "above_roof",
           "max_pct_above_roof", "note")
COUNTS = ("ok", "noisy", "above_roof", "failed", "incorrect", "skipped", "ceilings_moved_pct", "roof_unresolved")
_CASE_KEY = ("model", *CASE_FIELDS, "dtype")


def headline(df: pd.DataFrame | None = None, phases=None, *, include_profiled: bool = False) -> Headline:
    """The headline of result rows (as `load` returns them) and of `phasebench phases` tables (a `load_phases`
    dict or a list of them); either may be None. Profiled rows are left out unless include_profiled."""
    df = report_rows(df, include_profiled=include_profiled) if df is not None else pd.DataFrame(columns=["status"])
    phase_list = [phases] if isinstance(phases, dict) else list(phases or ())
    return Headline(frame=best_table(df), correctness=correctness_summary(df), counts=row_counts(df),
                    phases=[phases_headline(tables) for tables in phase_list])


def _group_fields(df: pd.DataFrame) -> list[str]:
    return [name for name in GROUP_BY if name in df.columns]


def _groups(df: pd.DataFrame):
    fields = _group_fields(df)
    if df.empty or not fields:
        return
    for key, rows in df.groupby(fields, sort=True, dropna=False):
        yield dict(zip(fields, key if isinstance(key, tuple) else (key,), strict=True)), rows


def _op_phases(rows: pd.DataFrame):
    ops = rows["op"].replace("", "attention") if "op" in rows else pd.Series("attention", index=rows.index)
    for op in ordered_ops(ops.unique()):
        of_op = rows[ops == op]
        for phase in ordered_phases(of_op["phase"].unique()):
            yield op, phase, of_op[of_op["phase"] == phase]


def best_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per (device, mode, timer, profiled, dtype) group of compiled rows and per op and phase: the impl with the
    highest geometric mean % of the measured roof over the cases every impl measured (each impl's own cases where
    they share none), that mean and the best case's, the bound of its rows, and the runner-up with the geometric
    mean speedup over it on the cases both measured. Only rows neither noisy nor above their roof count; those above
    it are marked beside: how many (above_roof), the highest % of roof among them, and a note that says so."""
    out = []
    for group, rows in _groups(df[~interpreter(df)] if "mode" in df else df):
        for op, phase, part in _op_phases(rows):
            out.append({**group, "op": op, "phase": phase, **_best(part)})
    return pd.DataFrame(out, columns=list(COLUMNS))


def _best(rows: pd.DataFrame) -> dict:
    above = finding_rows(rows)  # marked beside the best: how many, and the highest share of its roof
    marks = {"above_roof": len(above), "max_pct_above_roof": float(above["pct_roofline"].max()) if len(above)
             else float("nan")}
    clean = performance_rows(rows)
    if clean.empty:
        return {"best_impl": "", **marks, "note": _why_none(rows)}
    return {**_best_of(clean), **marks}


def _best_of(clean: pd.DataFrame) -> dict:
    key = [name for name in _CASE_KEY if name in clean.columns]
    clean = clean.assign(_case=clean[key].apply(lambda column: column.map(key_text)).agg("\x1f".join, axis=1))
    per_case = clean.groupby(["impl", "_case"], sort=False).agg(
        pct=("pct_roofline", "median"), latency=("latency_ms", "median"), bound=("bound", "first")).reset_index()
    cases = {impl: set(part["_case"]) for impl, part in per_case.groupby("impl")}
    shared = set.intersection(*cases.values()) if len(cases) > 1 else set()
    used = per_case[per_case["_case"].isin(shared)] if shared else per_case
    scores = used.groupby("impl")["pct"].agg(_geomean)
    ranked = sorted(scores.index, key=lambda impl: (-scores[impl], ordered_impls(scores.index).index(impl)))
    best = ranked[0]
    mine = used[used["impl"] == best]
    found = {"best_impl": best, "pct_roofline": float(scores[best]), "max_pct_roofline": float(mine["pct"].max()),
             "bound": _bound(mine["bound"]), "cases": len(mine), "shared": bool(shared),
             "note": "" if len(cases) > 1 else "only impl measured"}
    if len(ranked) > 1:
        runner = ranked[1]
        found.update(runner_up=runner, runner_up_pct=float(scores[runner]), speedup=_speedup(per_case, best, runner))
    return found


def _geomean(values: pd.Series) -> float:
    values = values[values > 0]
    return float(np.exp(np.log(values).mean())) if len(values) else float("nan")


def _bound(bounds: pd.Series) -> str:
    counts = bounds.replace("", "unknown").value_counts()
    if len(counts) == 1:
        return str(counts.index[0])
    return ", ".join(f"{name} {count}" for name, count in counts.items())


def _speedup(per_case: pd.DataFrame, best: str, runner: str) -> float:
    """Geometric mean of runner latency / best latency over the cases both measured (NaN: none)."""
    wide = per_case.pivot_table(index="_case", columns="impl", values="latency", aggfunc="median")
    both = wide[[best, runner]].dropna()
    if both.empty:
        return float("nan")
    return float(np.exp(np.log(both[runner] / both[best]).mean()))


def _why_none(rows: pd.DataFrame) -> str:
    ok = ok_rows(rows)
    parts = [f"{int(flag(ok, 'noisy').sum())} noisy", f"{int((flag(ok, 'above_roof') & ~flag(ok, 'noisy')).sum())} "
             "above roof", f"{int((rows['status'] != 'ok').sum())} not ok"]
    return "no quiet ok row at or under its roof: " + ", ".join(part for part in parts if not part.startswith("0 "))


def correctness_summary(df: pd.DataFrame) -> pd.DataFrame:
    """The interpreter-mode rows per device, dtype, op and impl: how many were ok and not, and the worst error."""
    columns = ["device", "dtype", "op", "impl", "ok", "not_ok", "worst_max_rel_err"]
    rows = df[interpreter(df)] if "mode" in df else df.iloc[0:0]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    table = rows.groupby(["device", "dtype", "op", "impl"], sort=True, dropna=False).agg(
        ok=("status", lambda s: int((s == "ok").sum())), not_ok=("status", lambda s: int((s != "ok").sum())),
        worst_max_rel_err=("max_rel_err", "max")).reset_index()
    return table[columns]


def row_counts(df: pd.DataFrame) -> pd.DataFrame:
    """Per (device, mode, timer, profiled, dtype) group: rows ok, noisy and above their roof (of the ok, compiled
    ones), failed, incorrect and skipped; how far the ceilings moved while its timed rows ran (the largest
    ceiling_drift_pct: their roofs over the measurements around their rounds) and how many of those rows that leaves
    unresolved against their roof (roof_verdict)."""
    out = []
    for group, rows in _groups(df):
        ok = ok_rows(rows)
        timed = ok[~interpreter(ok)]
        noisy = flag(timed, "noisy")
        out.append({**group, "ok": len(ok), "noisy": int(noisy.sum()),
                    "above_roof": int((flag(timed, "above_roof") & ~noisy).sum()),
                    **{status: int((rows["status"] == status).sum()) for status in ("failed", "incorrect", "skipped")},
                    "ceilings_moved_pct": float(pd.to_numeric(timed.get("ceiling_drift_pct"), errors="coerce").max())
                    if "ceiling_drift_pct" in timed and len(timed) else float("nan"),
                    "roof_unresolved": int((timed["roof_verdict"] == "unresolved").sum())
                    if "roof_verdict" in timed else 0})
    return pd.DataFrame(out, columns=_group_fields(df) + list(COUNTS))


def phases_headline(tables: dict) -> dict:
    """What a phases folder says in a few numbers: its setting, TTFT per prompt, the decode sweep (TPOT,
    tokens/s and tokens/s per user per batch), the saturation sentence, how many of those points lack an op
    (left out), the interactive limits per prompt and the composition's errors against a real forward pass (the
    published figures', the interleaved rounds', per layer, with their intervals; the verdict within / over /
    unresolved)."""
    meta = tables.get("meta") or {}
    model = meta.get("model") if isinstance(meta.get("model"), dict) else {"name": meta.get("model")}
    found = {"model": model.get("name") or "?", "layers": model.get("layers"), "device": meta.get("device"),
             "dtype": meta.get("dtype"), "impls": meta.get("impls") or {}}
    prefill = tables.get("prefill")
    found["ttft"] = (prefill.sort_values("prompt")[["prompt", "ttft_ms", "prompt_tokens_per_s"]]
                     .reset_index(drop=True) if prefill is not None and len(prefill) else None)
    decode = tables.get("decode")
    if decode is not None and len(decode):
        decode = decode.sort_values("batch")
        found["context"] = decode["context"].iloc[0]
        found["decode"] = decode[["batch", "tpot_ms", "tokens_per_s", "tokens_per_s_per_user"]].reset_index(drop=True)
        knee = decode.loc[decode["saturated"].map(cell_true), "batch"]
        found["saturation_batch"] = int(knee.iloc[0]) if len(knee) else None
        found["saturation"] = saturation_text(found["saturation_batch"], int(decode["batch"].max()))
    points = [table for table in (prefill, decode) if table is not None and len(table) and "missing" in table]
    found["points"] = sum(len(table) for table in points)
    found["left_out"] = sum(int((pd.to_numeric(table["missing"], errors="coerce") > 0).sum()) for table in points)
    found["interactive"] = _interactive(tables.get("interactive"))
    reference = reference_table(tables)
    found["composition"] = reference[["reference", "phase", "layers", "batch", "error_pct", "error_low_pct",
                                      "error_high_pct", "published_per_layer_error_pct",
                                      "published_per_layer_error_low_pct", "published_per_layer_error_high_pct",
                                      "per_layer_error_pct", "per_layer_error_low_pct", "per_layer_error_high_pct",
                                      "goal_pct", "verdict"]] if len(reference) else None
    return found


def _interactive(limits: pd.DataFrame | None) -> pd.DataFrame | None:
    """Per prompt: its TTFT, whether it meets the TTFT target, and the largest batch (0: none) per user rate."""
    if limits is None or not len(limits):
        return None
    wide = limits.pivot_table(index="prompt", columns="user_tokens_per_s_target", values="largest_batch",
                              aggfunc="max")
    wide.columns = [f"batch_at_{target:g}_tok_s" for target in wide.columns]
    first = limits.groupby("prompt").agg(ttft_ms=("ttft_ms", "first"), ttft_target_s=("ttft_target_s", "first"))
    table = first.join(wide).reset_index()
    table.insert(3, "meets_ttft", table["ttft_ms"] <= 1e3 * table["ttft_target_s"])
    return table
