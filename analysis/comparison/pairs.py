"""Compare two result sets: pairs of the same measurement, the ratio of their medians with an interval, a verdict."""

from __future__ import annotations

import json
import math
import zlib
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pandas as pd

from ...bench.spec.between_runs import latencies_of, paired_ratio, paired_rounds, ratio_between_runs
from ...bench.spec.interval import ratio_interval
from ...bench.spec.schema import (
    CASE_FIELDS,
    SAMPLES_COLUMN,
    cell_float,
    cell_true,
    conform,
    key_text,
    read_samples,
    sample_key,
)
from ..figures.kit import GROUP_FIELDS

__all__ = ["BY", "KINDS", "VERDICTS", "compare", "parse_threshold", "regression_line", "regressions",
           "with_samples"]

# What may differ between the two sides of a pair, and the column that holds it.
BY = {"run": "run_id", "impl": "impl", "device": "device", "timer": "timer"}
# slower / faster: the ratio's interval lies past the threshold; within threshold: it lies inside the band, so any
# change is smaller than the threshold; unresolved: it straddles an edge of the band (or there is none): no verdict.
VERDICTS = ("faster", "slower", "within threshold", "unresolved")
KINDS = ("pair", "status change", "base only", "new only")  # a comparison row's `pairing`
RESAMPLES = 2000
MIN_BOOTSTRAP = 6  # fewer samples on a side (older files): the interval comes from the spread columns
# Two rows are the same measurement when they agree on all of these (less the compared dimension).
KEY_FIELDS = tuple(dict.fromkeys(("op", "model", *CASE_FIELDS, "dtype", "impl", *GROUP_FIELDS)))
# Per side, in the output as base_X and new_X.
SIDE_FIELDS = ("run_id", "impl", "device", "timer", "backend", "status", "reason", "latency_ms", "latency_ci_low_ms",
               "latency_ci_high_ms", "converged", "samples", "tflops", "gbps", "pct_roofline", "noisy", "noise_reason",
               "source", "rounds", "round_latencies_ms", "latency_between_low_ms", "latency_between_high_ms")
# What each way of making a pair's interval covers (a comparison row's `covers`): a verdict from rounds holds between
# runs, and two runs of the same code are then called slower or faster with probability 1 - confidence at most.
BETWEEN, WITHIN = "between runs", "within each run"
METHOD_COVERS = {"rounds (Welch)": BETWEEN, "rounds (paired)": BETWEEN}
# z of the half-width of the 20-80 and 25-75 percentile ranges of a normal distribution.
_SPREAD_Z = {"p20/p80": NormalDist().inv_cdf(0.8), "q1/q3": NormalDist().inv_cdf(0.75)}
_MEDIAN_SE = math.sqrt(math.pi / 2)  # standard error of a median: sqrt(pi/2) * sigma / sqrt(n)
_SEP = "\x1f"


def parse_threshold(text) -> float:
    """'5%' or '0.05' -> 0.05; one-line ValueError otherwise."""
    word = str(text).strip()
    try:
        value = float(word[:-1]) / 100 if word.endswith("%") else float(word)
    except ValueError:
        raise ValueError(f"threshold: expected a fraction (0.05) or a percentage (5%), got {text!r}") from None
    if not word.endswith("%") and value >= 1:
        raise ValueError(f"threshold: {text!r} reads as {value:g}x; write a percentage (5%) or a fraction (0.05)")
    if not 0 <= value < 1:
        raise ValueError(f"threshold: must be at least 0 and below 100%, got {text!r}")
    return value


# ---------------------------------------------------------------- raw samples


def with_samples(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with a `samples_ms` column (arrays of ms, None where unknown) filled from what its
    sources kept: results.parquet's column, DIR/samples.jsonl beside a results.csv (a run that
    died before writing parquet), or a pytest-benchmark JSON's stats.data."""
    out = frame.copy()
    if SAMPLES_COLUMN not in out.columns:
        out[SAMPLES_COLUMN] = None
    out[SAMPLES_COLUMN] = out[SAMPLES_COLUMN].astype(object)
    values = [_as_samples(v) for v in out[SAMPLES_COLUMN]]
    if "source" in out.columns:
        lacking = [i for i, v in enumerate(values) if v is None]
        sources = out["source"].astype(str).to_numpy()
        for source in sorted({sources[i] for i in lacking}):
            rows = [i for i in lacking if sources[i] == source]
            found = _samples_from(Path(source), out.iloc[rows])
            for i, got in zip(rows, found, strict=True):
                values[i] = got
    out[SAMPLES_COLUMN] = pd.Series(values, index=out.index, dtype=object)
    return out


def _as_samples(value) -> np.ndarray | None:
    if value is None or (np.isscalar(value) and pd.isna(value)):
        return None
    array = np.asarray(value, dtype=float)
    return array if array.size else None


def _samples_from(path: Path, rows: pd.DataFrame) -> list:
    if path.suffix == ".json":
        data = _benchmark_data(path)
        names = rows["benchmark"].astype(str) if "benchmark" in rows.columns else pd.Series("", index=rows.index)
        return [_as_samples(data.get(name)) for name in names]
    if path.suffix in (".csv", ".parquet"):
        kept = read_samples(path.parent / "samples.jsonl")
        return [_as_samples(kept.get(sample_key(row))) for row in rows.to_dict("records")]
    return [None] * len(rows)


def _benchmark_data(path: Path) -> dict[str, list[float]]:
    """{fullname: samples in ms} of a pytest-benchmark JSON (`--benchmark-json` writes stats.data)."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    found = {}
    for bench in document.get("benchmarks") or ():
        data = (bench.get("stats") or {}).get("data")
        if isinstance(data, list) and data:
            found[bench.get("fullname") or bench.get("name", "")] = [1e3 * float(s) for s in data]
    return found


# ---------------------------------------------------------------- pairing


def _side(source) -> pd.DataFrame:
    if isinstance(source, pd.DataFrame):
        frame = source if "status" in source.columns and "impl" in source.columns else conform(source)
    else:
        from ..loading.results import load

        frame = load(source)
    return with_samples(frame)


def _key_fields(frame: pd.DataFrame, by: str) -> list[str]:
    return [name for name in KEY_FIELDS if name in frame.columns and name != BY[by]]


def _keyed(rows: pd.DataFrame, fields: list[str]) -> pd.DataFrame:
    """One row per key (the latest by `time`; `rows` counts how many shared it), with the key in `_key`."""
    if rows.empty:
        return rows.assign(_key=pd.Series(dtype=str), rows=pd.Series(dtype=int))
    texts = [_SEP.join(key_text(row[name]) for name in fields) for row in rows[fields].to_dict("records")]
    rows = rows.assign(_key=texts)
    order = rows.sort_values("time", kind="stable") if "time" in rows.columns else rows
    counts = order.groupby("_key").size()
    latest = order.drop_duplicates("_key", keep="last")
    return latest.assign(rows=latest["_key"].map(counts).to_numpy())


def compare(a, b=None, *, by: str = "run", base_impl: str | None = None, new_impl: str | None = None,
            threshold: float = 0.05, confidence: float = 0.95, seed: int = 0,
            resamples: int = RESAMPLES) -> pd.DataFrame:
    """Compare result set `b` (new) against `a` (base); frames or paths as `load` takes them.

    Two rows pair when they are the same measurement: equal op, model, case fields, dtype, impl,
    device, mode, timer and profiled, less the dimension `by` that is compared:
    - "run": two result sets of the same cases (before and after a change);
    - "impl": impl `new_impl` against `base_impl`, rows of `a` against rows of `b` (or of `a` when b is None);
    - "device" / "timer": two sets of one impl list on two devices, or two clocks (runner against pytest-benchmark).
    A side with several rows of one key uses the latest (by `time`); base_rows / new_rows count them.

    ratio = new median / base median (above 1: slower). Where both rows were measured in rounds (two
    or more each, schema 8: each round in a worker process of its own), its interval (`confidence`,
    two-sided) comes from the rounds' medians: Welch's t interval of the two sides' mean log medians
    (two runs), or a paired t interval of the per-round log ratios where both rows are of one run
    with as many rounds (two impls in the same processes and moments); it covers the drift between
    runs (`covers` "between runs"), so two runs of the same code are called slower or faster with
    probability 1 - confidence at most (the A/A test: docs/measuring.md). Otherwise it is a
    percentile bootstrap: both sides' raw samples resampled with replacement, independently,
    `resamples` times, the ratio of the two medians each time (seeded per pair by `seed` and its
    key). Without raw samples on both sides (at least 3 each), it comes from the rows' own 95%
    intervals of their medians (schema 7: bench.spec.interval.ratio_interval, their log arms in
    quadrature); for older rows, a normal approximation in log space from each side's spread
    (p20/p80 of runner rows, q1/q3 of pytest-benchmark rows: sigma = half the range / z of that
    range, standard error of a median sqrt(pi/2) sigma / sqrt(n)); the `method` column says which.
    Verdict (symmetric in log space, so swapping sides swaps it): slower when the interval's lower
    end exceeds 1 + threshold, faster when its upper end is below 1 / (1 + threshold), within
    threshold when it lies between the two, unresolved when it straddles either (or none can be
    made): the two medians are not told apart at that threshold. Without rounds the interval
    covers the spread within each run only (`covers` "within each run"), and the threshold is the
    only allowance for run-to-run drift.

    Returns one tidy frame, one row per key: `pairing` is "pair" (both ok), "status change" (both
    sides have the key, not both ok: "ok -> incorrect", "failed -> failed"...), "base only" or
    "new only"; nothing is dropped. Columns: the key fields, case (a label), base_/new_ run_id,
    impl, device, timer, backend, status, reason, latency_ms, samples, tflops, gbps, pct_roofline,
    noisy, noise_reason, rounds, round_latencies_ms, latency_between_low_ms and _high_ms, source and
    rows; ratio, ratio_lo, ratio_hi, method, covers, verdict, noisy (either side), interpreter
    (either side in Triton's interpreter: not performance, never a regression), in_base_between
    (the new median inside the base row's between-run interval; None without one), change. attrs
    hold by, threshold and confidence.
    """
    if by not in BY:
        raise ValueError(f"by: expected one of {', '.join(BY)}, got {by!r}")
    if not (isinstance(threshold, (int, float)) and 0 <= threshold < 1):
        raise ValueError(f"threshold: must be a fraction in [0, 1), got {threshold!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence: must be in (0, 1), got {confidence!r}")
    if by == "impl":
        if not base_impl or not new_impl:
            raise ValueError("base_impl, new_impl: by='impl' needs both (e.g. base_impl='flash', new_impl='triton')")
    elif base_impl or new_impl:
        raise ValueError(f"base_impl, new_impl: go with by='impl', not by={by!r}")
    elif b is None:
        raise ValueError(f"b: by={by!r} compares two result sets; give the new one")
    base = _side(a)
    new = base if b is None else _side(b)
    if by == "impl":
        for name, side, impl in (("base_impl", base, base_impl), ("new_impl", new, new_impl)):
            if not (side["impl"] == impl).any():
                raise ValueError(f"{name}: no rows of impl {impl!r} (found {', '.join(sorted(set(side['impl'])))})")
        base, new = base[base["impl"] == base_impl], new[new["impl"] == new_impl]
    fields = [name for name in _key_fields(base, by) if name in new.columns]
    left, right = _keyed(base, fields), _keyed(new, fields)
    merged = left.add_prefix("base_").rename(columns={"base__key": "_key"}).merge(
        right.add_prefix("new_").rename(columns={"new__key": "_key"}), on="_key", how="outer", indicator=True)
    records = [_record(row, fields, threshold, confidence, seed, resamples, by) for row in merged.to_dict("records")]
    frame = pd.DataFrame(records, columns=_columns(fields)).infer_objects()
    frame = _ordered(frame)
    frame.attrs.update(by=by, threshold=float(threshold), confidence=float(confidence))
    return frame


def _columns(fields: list[str]) -> list[str]:
    sides = [f"{side}_{name}" for name in (*SIDE_FIELDS, "rows") for side in ("base", "new")]
    return ["pairing", *fields, "case", "ratio", "ratio_lo", "ratio_hi", "method", "covers", "verdict", "noisy",
            "interpreter", "in_base_between", "change", *sides]


def _record(row: dict, fields: list[str], threshold: float, confidence: float, seed: int, resamples: int,
            by: str = "run") -> dict:
    where = row["_merge"]
    present = "base" if where in ("both", "left_only") else "new"
    out = {name: row.get(f"{present}_{name}") for name in fields}
    for side in ("base", "new"):
        for name in (*SIDE_FIELDS, "rows"):
            out[f"{side}_{name}"] = row.get(f"{side}_{name}")
    out["case"] = _case_label({**out, "shape": row.get(f"{present}_shape")})
    out["noisy"] = cell_true(out["base_noisy"]) or cell_true(out["new_noisy"])
    out["interpreter"] = "interpreter" in (row.get("base_mode"), row.get("new_mode"))
    out["change"] = ""
    if where != "both":
        out["pairing"] = "base only" if where == "left_only" else "new only"
        return out
    if not (out["base_status"] == "ok" and out["new_status"] == "ok"):
        out["pairing"], out["change"] = "status change", f"{out['base_status']} -> {out['new_status']}"
        return out
    out["pairing"] = "pair"
    ratio = float(out["new_latency_ms"]) / float(out["base_latency_ms"])
    rng = np.random.default_rng([seed, zlib.crc32(row["_key"].encode())])  # a pair's interval ignores the others
    low, high, method = _interval(row, ratio, confidence, rng, resamples, by)
    out.update(ratio=ratio, ratio_lo=low, ratio_hi=high, method=method, verdict=_verdict(low, high, threshold),
               covers=METHOD_COVERS.get(method, WITHIN), in_base_between=_inside_base(out))
    return out


def _inside_base(out: dict) -> object:
    """Whether the new median lies inside the base row's between-run interval (the A/A test's coverage); None where
    the base row has none."""
    low, high = (cell_float(out.get(f"base_latency_between_{end}_ms")) for end in ("low", "high"))
    latency = cell_float(out.get("new_latency_ms"))
    if not (math.isfinite(low) and math.isfinite(high) and math.isfinite(latency)):
        return None
    return bool(low <= latency <= high)


def _rounds_interval(row: dict, ratio: float, confidence: float, by: str) -> tuple[float, float, str] | None:
    """From the two rows' rounds, where both have two or more: paired by round where two impls come from one run and
    share two or more rounds that both ran in their turn (by impl: the same processes and moments), else Welch's
    interval of two runs' rounds (bench.spec.between_runs). None without rounds on both sides."""
    cells = [row.get(f"{side}_round_latencies_ms") for side in ("new", "base")]
    new, base = (latencies_of(cell) for cell in cells)
    if min(len(base), len(new)) < 2:
        return None
    if by == "impl" and key_text(row.get("base_run_id")) == key_text(row.get("new_run_id")):
        paired = paired_rounds(*cells)  # only the rounds both ran in their turn: the same process and moment
        if len(paired[0]) >= 2:
            low, high = paired_ratio(*paired, ratio, confidence)
            return low, high, "rounds (paired)"
    low, high, _ = ratio_between_runs(new, base, ratio, confidence)
    return low, high, "rounds (Welch)"


def _interval(row: dict, ratio: float, confidence: float, rng, resamples: int,
              by: str = "run") -> tuple[float, float, str]:
    found = _rounds_interval(row, ratio, confidence, by)
    if found is not None and math.isfinite(found[0]):
        return found
    # a row of rounds publishes its rounds' geometric mean, not its pooled samples' median: beside a row of one round
    # the pair is judged on the two rows' own intervals of what they publish, never a bootstrap of another figure
    rounds = any(len(latencies_of(row.get(f"{side}_round_latencies_ms"))) >= 2 for side in ("base", "new"))
    base, new = _as_samples(row.get(f"base_{SAMPLES_COLUMN}")), _as_samples(row.get(f"new_{SAMPLES_COLUMN}"))
    if not rounds and base is not None and new is not None and min(len(base), len(new)) >= MIN_BOOTSTRAP:
        medians = [np.median(s[rng.integers(0, len(s), size=(resamples, len(s)))], axis=1) for s in (base, new)]
        ratios = medians[1] / medians[0]
        tail = (1 - confidence) / 2
        return float(np.quantile(ratios, tail)), float(np.quantile(ratios, 1 - tail)), "bootstrap"
    sides = [tuple(cell_float(row.get(f"{side}_{name}")) for name in ("latency_ms", "latency_ci_low_ms",
                                                                      "latency_ci_high_ms"))
             for side in ("new", "base")]
    if confidence == 0.95 and all(math.isfinite(x) for side in sides for x in side):
        _, low, high = ratio_interval(*sides)
        if math.isfinite(low):
            return low, high, "row intervals"
    errors, kinds = [], []
    for side in ("base", "new"):
        kind = "q1/q3" if str(row.get(f"{side}_source") or "").endswith(".json") else "p20/p80"
        low, high, median = (cell_float(row.get(f"{side}_{name}")) for name in ("latency_p20_ms", "latency_p80_ms",
                                                                            "latency_ms"))
        count = cell_float(row.get(f"{side}_samples"))
        if not (0 < low <= median <= high and count >= 2):
            return math.nan, math.nan, "none"
        sigma = (math.log(high) - math.log(low)) / (2 * _SPREAD_Z[kind])
        errors.append(_MEDIAN_SE * sigma / math.sqrt(count))
        kinds.append(kind)
    z = NormalDist().inv_cdf((1 + confidence) / 2) * math.hypot(*errors)
    return ratio * math.exp(-z), ratio * math.exp(z), "spread " + " | ".join(dict.fromkeys(kinds))


def _verdict(low: float, high: float, threshold: float) -> str:
    if low > 1 + threshold:
        return "slower"
    if high < 1 / (1 + threshold):
        return "faster"
    if 1 / (1 + threshold) <= low and high <= 1 + threshold:
        return "within threshold"
    return "unresolved"


def _ordered(frame: pd.DataFrame) -> pd.DataFrame:
    """Pairs first (slower, faster, unresolved, within threshold; larger ratio first), then status changes, base
    only, new only."""
    rank = {kind: index for index, kind in enumerate(KINDS)}
    verdict = {name: index for index, name in enumerate(("slower", "faster", "unresolved", "within threshold"))}
    keys = pd.DataFrame({"pairing": frame["pairing"].map(rank), "verdict": frame["verdict"].map(verdict).fillna(9),
                         "ratio": -pd.to_numeric(frame["ratio"], errors="coerce").fillna(0), "case": frame["case"]})
    order = keys.sort_values(["pairing", "verdict", "ratio", "case"], kind="stable").index
    return frame.loc[order].reset_index(drop=True)


def _case_label(row: dict) -> str:
    """The row's shape label ('b2 h32/8 q1 k512 d128 causal') and dtype; built from the case fields without one."""
    shape = str(row.get("shape") or "").strip()
    if not shape and row.get("op") in ("linear", "qlinear"):
        shape = " ".join(str(part) for part in (row.get("projection") or "", f"m{key_text(row.get('m'))}",
                                                f"n{key_text(row.get('n'))}", f"k{key_text(row.get('k'))}",
                                                key_text(row.get("scheme"))) if part)
    elif not shape and key_text(row.get("batch")):
        shape = (f"b{key_text(row.get('batch'))} h{key_text(row.get('q_heads'))}/{key_text(row.get('kv_heads'))} "
                 f"q{key_text(row.get('q_len'))} k{key_text(row.get('kv_len'))} d{key_text(row.get('head_dim'))}"
                 + (" causal" if cell_true(row.get("causal")) else ""))
    shape = shape or f"{row.get('op') or ''} {row.get('phase') or ''}".strip()
    return f"{shape} {row.get('dtype') or ''}".strip()


def regressions(frame: pd.DataFrame, *, allow_missing: bool = False) -> pd.DataFrame:
    """What fails a regression gate, with a `regression` column saying why: pairs found slower with confidence (less
    interpreter-mode ones: their timings are not performance), rows that were ok and are not any more, and, unless
    `allow_missing`, rows that were ok in the base and are missing from the new side."""
    pair = frame["pairing"] == "pair"
    slower = pair & (frame["verdict"] == "slower") & ~frame["interpreter"].astype(bool)
    was_ok = frame["base_status"] == "ok"
    broke = (frame["pairing"] == "status change") & was_ok
    vanished = (frame["pairing"] == "base only") & was_ok & (not allow_missing)
    out = frame[slower | broke | vanished].copy()
    out["regression"] = np.select([slower[out.index], broke[out.index]],
                                  ["slower", "ok -> " + out["new_status"].astype(str)], "missing in new")
    return out


def regression_line(row) -> str:
    """One line naming a regression: the case and impl, and what went wrong."""
    what = f"{row['case']} {key_text(row.get('new_impl')) or key_text(row.get('base_impl'))}".strip()
    if row["regression"] == "slower":
        return (f"{what}: slower, {row['ratio']:.3g}x [{row['ratio_lo']:.3g}, {row['ratio_hi']:.3g}]"
                + (" (noisy: re-run before believing it)" if row["noisy"] else ""))
    if row["regression"] == "missing in new":
        return f"{what}: ok in the base, missing in the new results"
    reason = str(row.get("new_reason") or "").strip()
    return f"{what}: {row['regression']}" + (f" ({reason[:120]})" if reason else "")
