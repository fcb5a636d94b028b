"""`phasebench interference` rows: loading them, the tables per decode batch and prompt (the hybrid iteration per chunk,
spatial sharing per mode), and what each user keeps of the whole model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from ...bench.spec.interference_schema import (
    CSV_NAME,
    INTERFERENCE_SCHEMA,
    MODES,
    RUN_JSON,
    STRING_COLUMNS,
    conform_interference,
)
from ..loading.results import DataFileError
from ..phases.model import USER_TARGETS

SHOWN = ("batch", "prompt", "mode", "mechanism", "itl_mean_ms", "itl_p50_ms", "itl_p90_ms", "itl_tail_ms", "itl_tail",
         "stretch", "tokens_per_s_per_user", "prefill_ms", "prefill_slowdown", "noisy")
# hybrid rows: the timed layers' figures (headed "@L"), then the whole model's, every one scaled the same way
HYBRID_SHOWN = ("batch", "prompt", "chunk", "iterations", "arrivals", "samples", "decode_only_ms", "itl_mean_ms",
                "itl_p50_ms", "itl_tail_ms", "itl_tail", "itl_position_max_ms", "position_range_pct",
                "arrival_range_pct", "ttft_ms", "ttft_low_ms", "ttft_high_ms", "chunk_cost", "decode_tokens_per_s",
                "model_itl_ms", "model_itl_tail_ms", "model_ttft_ms", "model_ttft_low_ms", "model_ttft_high_ms",
                "model_chunk_cost", "fixed_ms", "tokens_per_s_per_user")
# the terminal's: each TTFT with its interval in one cell
HYBRID_PRINTED = tuple(c for c in HYBRID_SHOWN if not c.endswith(("_low_ms", "_high_ms")))
SHORT = {"itl_mean_ms": "mean", "itl_p50_ms": "p50", "itl_p90_ms": "p90", "itl_p99_ms": "p99", "itl_max_ms": "max",
         "itl_tail_ms": "tail", "itl_tail": "tail_of", "decode_only_ms": "decode_only",
         "tokens_per_s_per_user": "tok/s/user", "prefill_slowdown": "prefill_x", "decode_tokens_per_s": "decode_tok/s"}
TIMED = ("decode_only_ms", "itl_mean_ms", "itl_p50_ms", "itl_tail_ms", "itl_position_max_ms", "ttft_ms", "ttft_low_ms",
         "ttft_high_ms", "chunk_cost", "decode_tokens_per_s")  # hybrid columns of the timed layers
HYBRID_SHORT = {**{c: f"{SHORT.get(c, c.removesuffix('_ms'))}@L" for c in TIMED},
                "itl_position_max_ms": "slowest_pos@L",
                "position_range_pct": "pos_range%", "arrival_range_pct": "arrival_range%",
                "model_itl_ms": "model_mean", "model_itl_tail_ms": "model_tail", "model_ttft_ms": "model_ttft",
                "model_ttft_low_ms": "model_ttft_low", "model_ttft_high_ms": "model_ttft_high",
                "model_chunk_cost": "model_chunk_cost", "fixed_ms": "fixed", "itl_tail": "tail_of",
                "tokens_per_s_per_user": "tok/s/user"}


def load_interference(*sources) -> pd.DataFrame:
    """The rows of `phasebench interference --out DIR` folders (or their interference.csv files), in one frame
    typed by bench.spec.interference_schema, with `source` (the file) and, from run.json beside it, `git_commit`,
    `torch_version` and (for files that lack it) `device_name`. A missing path raises FileNotFoundError; a
    malformed file DataFileError, one line led by the path."""
    paths = [Path(p) for s in sources for p in (s if isinstance(s, (list, tuple)) else [s])]
    if not paths:
        raise ValueError("load_interference() needs at least one path")
    frames = []
    for path in paths:
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such file or folder")
        csv = path / CSV_NAME if path.is_dir() else path
        if not csv.is_file():
            raise FileNotFoundError(f"{csv}: missing (`phasebench interference --out DIR` writes it)")
        frames.append(_read(csv))
    return pd.concat(frames, ignore_index=True)


def _read(csv: Path) -> pd.DataFrame:
    try:
        table = pd.read_csv(csv, dtype={c: str for c in STRING_COLUMNS}, keep_default_na=False, na_values=[""])
        table = conform_interference(table)
    except pd.errors.EmptyDataError:
        raise DataFileError(f"{csv}: file is empty") from None
    except Exception as error:  # the CSV parser raises many types; the schema ValueError names the column
        raise DataFileError(f"{csv}: {' '.join(str(error).split())}") from None
    meta = _meta(csv.parent / RUN_JSON)
    table["source"] = str(csv)
    table["git_commit"] = meta.get("git_commit") or ""
    versions = meta.get("versions") if isinstance(meta.get("versions"), dict) else {}
    table["torch_version"] = versions.get("torch") or ""
    named = (meta.get("device") or {}).get("name") if isinstance(meta.get("device"), dict) else None
    if named:  # files of schema 1 name the device in run.json only
        table.loc[table["device_name"] == "", "device_name"] = str(named)
    return table


def _meta(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:
        raise DataFileError(f"{path}: not valid JSON ({' '.join(str(error).split())})") from None
    schema = meta.get("interference_schema") if isinstance(meta, dict) else None
    if not isinstance(schema, int) or isinstance(schema, bool):
        raise DataFileError(f"{path}: 'interference_schema' must be an integer, got {schema!r}")
    if schema > INTERFERENCE_SCHEMA:
        raise DataFileError(f"{path}: schema {schema} is newer than this phasebench reads ({INTERFERENCE_SCHEMA})")
    return meta


def mode_label(mode: str, mechanism: str, chunk: str = "") -> str:
    if mode == "hybrid":
        return "hybrid (whole prompt)" if chunk == "whole" else f"hybrid (chunk {chunk})"
    return mode if mode == "alone" else f"{mode} ({mechanism})"


def ordered(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows by batch, prompt, then alone, colocated, protected, hybrid (by chunk, whole last)."""
    rank = rows["mode"].map({m: i for i, m in enumerate(MODES)})
    chunk = pd.to_numeric(rows["chunk"], errors="coerce").fillna(np.inf)
    return (rows.assign(_rank=rank, _chunk=chunk).sort_values(["batch", "prompt", "_rank", "mechanism", "_chunk"])
            .drop(columns=["_rank", "_chunk"]))


def spatial(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[rows["mode"] != "hybrid"]


def hybrid(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[rows["mode"] == "hybrid"]


def basis(row) -> str:
    """Where a row's per-user tokens/s come from: all the model's layers, or scaled from a few (schema <= 2 rows:
    the layers timed, not scaled)."""
    return str(row["whole_model"] or f"{row['layers']} layers timed, not scaled to the model")


def verdicts(rows: pd.DataFrame, targets=USER_TARGETS) -> pd.DataFrame:
    """Per (batch, prompt) and target tokens/s per user: the modes whose users keep it and those whose users do
    not (ok rows only; noisy ones count, marked in the summary)."""
    ok = ordered(rows[rows["status"] == "ok"])
    out = []
    for (batch, prompt), group in ok.groupby(["batch", "prompt"], sort=False):
        labels = [mode_label(m, k, c) for m, k, c in zip(group["mode"], group["mechanism"], group["chunk"],
                                                          strict=True)]
        rates = group["tokens_per_s_per_user"].to_numpy(float)
        bases = sorted({basis(row) for row in group.to_dict("records")})
        for target in targets:
            out.append({"batch": batch, "prompt": prompt, "target": target, "basis": "; ".join(bases),
                        "kept": [lab for lab, r in zip(labels, rates, strict=True) if r >= target],
                        "lost": [lab for lab, r in zip(labels, rates, strict=True) if r < target]})
    return pd.DataFrame(out, columns=["batch", "prompt", "target", "basis", "kept", "lost"])


def verdict_line(v: dict) -> str:
    return (f"batch {v['batch']}, prompt {v['prompt']}, {v['target']:g} tok/s ({v['basis']}): kept by "
            f"{', '.join(v['kept']) or 'none'}; lost by {', '.join(v['lost']) or 'none'}")


def _cell(value) -> str:
    if value is None or value is pd.NA or (isinstance(value, (float, np.floating)) and not np.isfinite(value)):
        return "–"
    if isinstance(value, (bool, np.bool_)):
        return "NOISY" if value else ""
    if isinstance(value, (int, np.integer)):
        return str(value)
    if isinstance(value, (float, np.floating)):
        return "–" if not np.isfinite(value) else f"{value:.3g}"
    return str(value)


def with_interval(rows: pd.DataFrame, *columns: str) -> pd.DataFrame:
    """Each column (x_ms) as text "value [low, high]" from x_low_ms and x_high_ms ("[–]": no interval)."""
    out = rows.copy()
    for column in columns:
        stem = column.removesuffix("_ms")
        out[column] = [f"{_cell(v)} [{_cell(lo)}, {_cell(hi)}]" if lo == lo and hi == hi else f"{_cell(v)} [–]"
                       for v, lo, hi in zip(rows[column], rows[f"{stem}_low_ms"], rows[f"{stem}_high_ms"], strict=True)]
    return out


def _table(rows: pd.DataFrame, columns, short=None) -> str:
    table = rows[[c for c in columns if c in rows]].rename(columns=short or SHORT)
    return table.to_string(index=False, na_rep="–", formatters={c: _cell for c in table.columns})


def interference_summary(rows: pd.DataFrame) -> str:
    """What `phasebench interference` prints: the hybrid iteration per batch, prompt and chunk (the decode users'
    ITL in ms against the decode-only iteration, TTFT, the cost of chunking), the spatial modes (the ITL's mean and
    tail, the median's stretch against alone, the prefill's slowdown), then who keeps the per-user targets."""
    if rows.empty:
        return "interference: no rows"
    first = rows.iloc[0]
    out = [f"interference · {first['model']} ({first['layers']} layers) · {first['device']} · {first['dtype']} · "
           f"context {first['context']}"]
    ok = ordered(rows[rows["status"] == "ok"])
    if len(hybrid(ok)):
        out += ["", "Hybrid iteration: one prompt's arrival in the decode users' iterations (ITL in ms over the "
                    "prompt's iterations; @L: of the layers timed, model_: the whole model, each iteration position "
                    "scaled from two depths with the fixed cost once; tail: p99 from 100 samples, else the max of N)",
                _table(with_interval(hybrid(ok), "ttft_ms", "model_ttft_ms"), HYBRID_PRINTED, HYBRID_SHORT)]
    if len(spatial(ok)):
        out += ["", "Spatial sharing: the decode step beside a looped prefill (ITL in ms over the decode steps)",
                _table(spatial(ok), SHOWN)]
    for row in rows[rows["status"] != "ok"].to_dict("records"):
        out.append(f"{row['status']}: batch {row['batch']} prompt {row['prompt']} "
                   f"{mode_label(row['mode'], row['mechanism'], row['chunk'])}: {row['reason']}")
    judged = verdicts(rows)
    if len(judged):
        out += ["", "Per-user targets (tokens/s each decode user sees, from the mean ITL of the whole model):"]
        out += [f"  {verdict_line(v)}" for v in judged.to_dict("records")]
    noisy = ok[ok["noisy"].astype(bool)]
    if len(noisy):
        out.append(f"\n{len(noisy)} of {len(ok)} rows NOISY (something besides the co-runner used the device), "
                   f"e.g. {noisy['noise_reason'].iloc[0]}")
    return "\n".join(out)
