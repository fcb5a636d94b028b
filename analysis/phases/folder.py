"""A `phasebench phases` folder read back: its tables by name (the columns each figure and table reads) and
phases.json."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ..loading.results import DataFileError
from .check import COLUMNS as CHECK_COLUMNS

# What `phasebench phases` writes (bench/phases/run_phases.py run_phases) and the columns each figure and table reads.
TABLES = {
    "prefill": ("prompt", "ttft_ms", "prompt_tokens_per_s", "missing"),
    "decode": ("batch", "context", "tpot_ms", "tokens_per_s", "tokens_per_s_per_user", "missing", "saturated"),
    "chunked": ("chunk", "prompt", "decode_batch", "context", "steps", "ttft_ms", "itl_ms", "itl_max_ms",
                "decode_only_ms", "itl_increase_pct", "unchunked_ttft_ms", "chunking_cost_pct", "missing"),
    "interactive": ("prompt", "ttft_ms", "ttft_target_s", "user_tokens_per_s_target", "largest_batch"),
    "decode_parts": ("op", "label", "part", "count", "latency_ms", "ms"),
    "reference": CHECK_COLUMNS,
    # the check's other figures per row (analysis/phases/check.py check_row): bracket counts, the interleaved step
    # error, each round's errors, the drift, what the composition leaves out
    "reference_details": ("reference", "phase", "batch", "tokens", "zero_layer_ms", "left_out"),
    "colocated": ("option", "prompt", "decode_batch", "context", "itl_ms", "tokens_per_s_per_user", "ttft_ms",
                  "source"),
    # --speculate only (analysis/phases/speculative.py): the composition and its check against a real loop
    "speculative": ("batch", "gamma", "alpha", "expected_tokens_per_pass", "tpot_ms", "draft_step_ms", "verify_ms",
                    "iteration_ms", "tokens_per_s_per_user", "tokens_per_s", "speedup", "best_gamma",
                    "break_even_alpha"),
    "speculative_check": ("batch", "gamma", "alpha", "loop_tokens_per_s_per_user", "composed_tokens_per_s_per_user",
                          "error_pct", "expected_tokens_per_pass", "realised_tokens_per_pass", "over_goal"),
    # --interference with hybrid rows of this model (analysis/phases/hybrid_check.py): composed vs measured
    # (new columns: phases/hybrid_check.py COLUMNS; these are those a folder of before the verdicts has too)
    "hybrid_check": ("batch", "prompt", "context", "chunk", "iterations", "measured_ttft_ms", "composed_ttft_ms",
                     "ttft_error_pct", "checked", "over_goal", "missing", "noisy_left_out"),
}
# folders without them lack them
OPTIONAL = ("colocated", "speculative", "speculative_check", "hybrid_check")
META = "phases.json"


def load_phases(path) -> dict[str, pd.DataFrame]:
    """The tables of a `phasebench phases --out DIR` folder (or its phases.json) by name, phases.json under "meta".

    A missing folder or file raises FileNotFoundError, a malformed one DataFileError; one line, led by the path."""
    folder = Path(path)
    if folder.name == META and folder.is_file():
        folder = folder.parent
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such folder (expected the --out folder of `phasebench phases`)")
    tables: dict = {"meta": _read_meta(folder / META)}
    for name, columns in TABLES.items():
        if name not in OPTIONAL or (folder / f"{name}.csv").is_file():
            tables[name] = _read_table(folder / f"{name}.csv", columns)
    if "saturated" in tables["decode"]:
        tables["decode"]["saturated"] = tables["decode"]["saturated"].map(as_bool)
    if "monotone_note" in tables["decode"]:  # "" where TPOT is in order: a CSV reads it back empty
        tables["decode"]["monotone_note"] = [v if isinstance(v, str) else "" for v in tables["decode"]["monotone_note"]]
    tables["reference"]["error"] = [v if isinstance(v, str) else "" for v in tables["reference"]["error"]]
    return tables


def _read_meta(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing (`phasebench phases` writes it beside the tables)")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise DataFileError(f"{path}: not valid JSON ({' '.join(str(error).split())})") from None
    if not isinstance(meta, dict):
        raise DataFileError(f"{path}: expected a JSON object, got {type(meta).__name__}")
    return meta


def _read_table(path: Path, columns) -> pd.DataFrame:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing (`phasebench phases` writes it)")
    try:
        table = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        raise DataFileError(f"{path}: file is empty") from None
    except Exception as error:  # the CSV parser raises many types
        raise DataFileError(f"{path}: cannot be read as CSV ({type(error).__name__}: "
                            f"{' '.join(str(error).split())})") from None
    lacking = [name for name in columns if name not in table.columns]
    if lacking:
        raise DataFileError(f"{path}: missing column(s) {', '.join(lacking)}")
    return table


def as_bool(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1")
    return bool(value) if pd.notna(value) else False
