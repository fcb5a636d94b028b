"""`phasebench interference` rows: loading them, the table per decode batch and prompt, and what each user keeps."""

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

SHOWN = ("batch", "prompt", "mode", "mechanism", "decode_ms", "decode_p90_ms", "stretch", "p90_stretch",
         "tokens_per_s_per_user", "prefill_ms", "prefill_slowdown", "noisy")


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


def mode_label(mode: str, mechanism: str) -> str:
    return mode if mode == "alone" else f"{mode} ({mechanism})"


def ordered(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows by batch, prompt, then alone, colocated, protected."""
    rank = rows["mode"].map({m: i for i, m in enumerate(MODES)})
    return rows.assign(_rank=rank).sort_values(["batch", "prompt", "_rank", "mechanism"]).drop(columns="_rank")


def verdicts(rows: pd.DataFrame, targets=USER_TARGETS) -> pd.DataFrame:
    """Per (batch, prompt) and target tokens/s per user: the modes whose users keep it and those whose users do
    not (ok rows only; noisy ones count, marked in the summary)."""
    ok = ordered(rows[rows["status"] == "ok"])
    out = []
    for (batch, prompt), group in ok.groupby(["batch", "prompt"], sort=False):
        labels = [mode_label(m, k) for m, k in zip(group["mode"], group["mechanism"], strict=True)]
        rates = group["tokens_per_s_per_user"].to_numpy(float)
        for target in targets:
            out.append({"batch": batch, "prompt": prompt, "target": target,
                        "kept": [lab for lab, r in zip(labels, rates, strict=True) if r >= target],
                        "lost": [lab for lab, r in zip(labels, rates, strict=True) if r < target]})
    return pd.DataFrame(out, columns=["batch", "prompt", "target", "kept", "lost"])


def _cell(value) -> str:
    if isinstance(value, (bool, np.bool_)):
        return "NOISY" if value else ""
    if isinstance(value, (int, np.integer)):
        return str(value)
    if isinstance(value, (float, np.floating)):
        return "–" if not np.isfinite(value) else f"{value:.3g}"
    return str(value)


def interference_summary(rows: pd.DataFrame) -> str:
    """What `phasebench interference` prints: the decode step per batch, prompt and mode (median and p90, the
    stretch against alone, each user's tokens/s), the prefill's slowdown, then who keeps the per-user targets."""
    if rows.empty:
        return "interference: no rows"
    first = rows.iloc[0]
    out = [f"interference · {first['model']} ({first['layers']} layers) · {first['device']} · {first['dtype']} · "
           f"context {first['context']}"]
    ok = ordered(rows[rows["status"] == "ok"])
    if len(ok):
        table = ok[list(SHOWN)].rename(columns={"tokens_per_s_per_user": "tok/s/user", "prefill_slowdown":
                                                "prefill_x"})
        out += ["", table.to_string(index=False, formatters={c: _cell for c in table.columns})]
    for row in rows[rows["status"] != "ok"].to_dict("records"):
        out.append(f"{row['status']}: batch {row['batch']} prompt {row['prompt']} "
                   f"{mode_label(row['mode'], row['mechanism'])}: {row['reason']}")
    judged = verdicts(rows)
    if len(judged):
        out += ["", "Per-user targets (tokens/s each decode user sees):"]
        for v in judged.to_dict("records"):
            out.append(f"  batch {v['batch']}, prompt {v['prompt']}, {v['target']:g} tok/s: kept by "
                       f"{', '.join(v['kept']) or 'none'}; lost by {', '.join(v['lost']) or 'none'}")
    noisy = ok[ok["noisy"].astype(bool)]
    if len(noisy):
        out.append(f"\n{len(noisy)} of {len(ok)} rows NOISY (something besides the co-runner used the device), "
                   f"e.g. {noisy['noise_reason'].iloc[0]}")
    return "\n".join(out)
