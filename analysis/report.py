"""Summary tables and a self-contained HTML report (figures as PNG files and embedded base64)."""

from __future__ import annotations

import base64
import html
import io
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from ._figures import ordered_impls, ordered_phases
from .phase_plots import phase_comparison, tokens_per_second
from .roofline_plot import roofline
from .scaling_plots import decode_scaling, prefill_scaling
from .schema import STATUSES
from .speedup import speedup

SUMMARY_COLUMNS = (
    "rows", "ok", "best_pct_roofline", "median_pct_roofline", "median_tflops", "median_gbps",
)

_CAPTIONS = {
    "roofline": "Each point is one ok row; solid roofs are the ceilings measured on the machine, "
                "dashed ones the datasheet figures; circles mark the ridge points.",
    "phase_comparison": "Latency and percentage of the measured roofline per implementation, "
                        "prefill against decode; a bar is the median.",
    "tokens_per_second": "Prompt tokens/s (batch·q_len / latency) against generated tokens/s "
                         "(batch / latency) for the same model preset: the prefill/decode gap.",
    "prefill_scaling": "Prefill latency and TFLOP/s as the sequence grows.",
    "decode_scaling": "Decode bandwidth as the KV cache grows, against the measured peak.",
    "speedup": "Speedup over the baseline implementation on identical cases.",
}

_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1250px; margin: 2em auto; color: #222; }
table { border-collapse: collapse; font-size: 13px; margin-bottom: 1.5em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #f2f2f2; }
img { max-width: 100%; border: 1px solid #eee; }
.note { color: #666; font-size: 13px; }
"""


def _sort_rows(table: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Phases and impls in their usual order rather than alphabetical."""
    keys = {}
    if "phase" in by:
        keys["phase"] = {name: index for index, name in enumerate(ordered_phases(table["phase"].unique()))}
    if "impl" in by:
        keys["impl"] = {name: index for index, name in enumerate(ordered_impls(table["impl"].unique()))}
    return table.sort_values(
        by, key=lambda column: column.map(keys[column.name]) if column.name in keys else column
    ).reset_index(drop=True)


def summary_table(df: pd.DataFrame, by=("phase", "impl")) -> pd.DataFrame:
    """Per group (phase and impl by default): row count, ok count, best and median
    pct_roofline, median TFLOP/s and GB/s over the ok rows."""
    by = list(by)
    if df.empty:
        return pd.DataFrame(columns=by + list(SUMMARY_COLUMNS))
    ok = df[df["status"] == "ok"]
    grouped_ok = ok.groupby(by, dropna=False, observed=True)
    table = pd.DataFrame({"rows": df.groupby(by, dropna=False, observed=True).size()})
    table["ok"] = grouped_ok.size()
    table["best_pct_roofline"] = grouped_ok["pct_roofline"].max()
    table["median_pct_roofline"] = grouped_ok["pct_roofline"].median()
    table["median_tflops"] = grouped_ok["tflops"].median()
    table["median_gbps"] = grouped_ok["gbps"].median()
    table["ok"] = table["ok"].fillna(0).astype(int)
    return _sort_rows(table.reset_index(), by)


def status_table(df: pd.DataFrame, by=("phase", "impl")) -> pd.DataFrame:
    """Per group: how many rows are ok, skipped, failed and incorrect (and any other status)."""
    by = list(by)
    statuses = list(STATUSES) + sorted(set(df["status"]) - set(STATUSES)) if not df.empty else list(STATUSES)
    if df.empty:
        return pd.DataFrame(columns=by + statuses + ["total"])
    counts = df.groupby(by + ["status"], dropna=False, observed=True).size().unstack("status", fill_value=0)
    counts = counts.reindex(columns=statuses, fill_value=0)
    counts.columns.name = None
    counts["total"] = counts.sum(axis=1)
    return _sort_rows(counts.reset_index(), by)


def problems_table(df: pd.DataFrame, limit: int = 40) -> pd.DataFrame:
    """The reasons rows are not ok, most frequent first."""
    columns = ["status", "impl", "phase", "reason", "rows"]
    bad = df[df["status"] != "ok"]
    if bad.empty:
        return pd.DataFrame(columns=columns)
    counts = bad.groupby(["status", "impl", "phase", "reason"], dropna=False).size().rename("rows")
    return counts.reset_index().sort_values("rows", ascending=False, kind="stable").head(limit)[columns]


def runs_table(df: pd.DataFrame) -> pd.DataFrame:
    """One line per (run_id, device): kind, row counts, earliest row time and versions."""
    columns = ["run_id", "device", "device_kind", "rows", "ok", "first_row", "torch_version", "triton_version"]
    if df.empty:
        return pd.DataFrame(columns=columns)
    grouped = df.groupby(["run_id", "device"], dropna=False, sort=True)
    table = grouped.agg(
        device_kind=("device_kind", "first"),
        rows=("status", "size"),
        ok=("status", lambda status: int((status == "ok").sum())),
        first_row=("time", "min"),
        torch_version=("torch_version", "first"),
        triton_version=("triton_version", "first"),
    )
    return table.reset_index()[columns]


def figures(df: pd.DataFrame, *, datasheet: dict | None = None, baseline: str = "naive") -> dict:
    """Every report figure by name (a name is also the PNG's file stem)."""
    return {
        "roofline": roofline(df, datasheet=datasheet),
        "phase_comparison": phase_comparison(df),
        "tokens_per_second": tokens_per_second(df),
        "prefill_scaling": prefill_scaling(df),
        "decode_scaling": decode_scaling(df),
        "speedup": speedup(df, baseline=baseline),
    }


def write_report(
    df: pd.DataFrame,
    out_dir,
    *,
    title: str = "phasebench report",
    datasheet: dict | None = None,
    baseline: str = "naive",
    dpi: int = 110,
) -> dict[str, Path]:
    """Write every figure as NAME.png, summary.csv and a self-contained report.html into
    out_dir (created if needed). Returns {figure name | "summary" | "html": path}."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    embedded: dict[str, str] = {}
    for name, fig in figures(df, datasheet=datasheet, baseline=baseline).items():
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=dpi)
        png = buffer.getvalue()
        paths[name] = out / f"{name}.png"
        paths[name].write_bytes(png)
        embedded[name] = base64.b64encode(png).decode("ascii")

    summary = summary_table(df)
    paths["summary"] = out / "summary.csv"
    summary.to_csv(paths["summary"], index=False)

    paths["html"] = out / "report.html"
    paths["html"].write_text(_html(df, title, summary, embedded), encoding="utf-8")
    return paths


def _table_html(table: pd.DataFrame) -> str:
    if table.empty:
        return '<p class="note">(none)</p>'
    return table.to_html(index=False, border=0, na_rep="–", float_format=_format_number, escape=True)


def _format_number(value: float) -> str:
    if not np.isfinite(value):
        return "–"
    return f"{value:.1f}" if abs(value) >= 1 else f"{value:.3g}"


def _html(df: pd.DataFrame, title: str, summary: pd.DataFrame, embedded: dict[str, str]) -> str:
    runs = runs_table(df)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="note">Generated {stamp} from {len(df)} rows in {len(runs)} run(s). '
        "Percentages are against the roofline measured on the machine that ran the row.</p>",
        "<h2>Runs</h2>", _table_html(runs),
        "<h2>Summary by phase and implementation</h2>",
        '<p class="note">Over the ok rows: best and median % of the measured roofline, '
        "median TFLOP/s and GB/s.</p>",
        _table_html(summary),
        "<h2>Status</h2>", _table_html(status_table(df)),
        "<h2>Rows that are not ok</h2>", _table_html(problems_table(df)),
        "<h2>Figures</h2>",
    ]
    for name, encoded in embedded.items():
        heading = name.replace("_", " ")
        parts += [
            f'<h3 id="{name}">{html.escape(heading)}</h3>',
            f'<p class="note">{html.escape(_CAPTIONS.get(name, ""))}</p>',
            f'<img alt="{html.escape(heading)}" src="data:image/png;base64,{encoded}">',
        ]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
