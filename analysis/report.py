"""Summary tables and a self-contained HTML report (figures as PNG files and embedded base64)."""

from __future__ import annotations

import base64
import html
import io
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from ..bench.spec.schema import STATUSES
from ._figures import (
    GROUP_FIELDS,
    interpreter,
    ok_rows,
    op_rows,
    ordered_impls,
    ordered_ops,
    ordered_phases,
    performance_rows,
)
from .linear_plots import layer_tokens_per_second, linear_crossings, linear_sweep
from .paged_plots import paged_section
from .phase_plots import phase_comparison, tokens_per_second
from .phases import PHASE_FIGURES, reference_table
from .roofline_plot import roofline
from .scaling_plots import decode_scaling, prefill_scaling
from .speedup import speedup

SUMMARY_COLUMNS = (
    "ok", "noisy", "best_pct_roofline", "median_pct_roofline", "median_tflops", "median_gbps",
)
SUMMARY_BY = GROUP_FIELDS + ("op", "phase", "impl")
STATUS_BY = ("device", "mode", "op", "phase", "impl")
CORRECTNESS_COLUMNS = ("device", "impl", "case", "max_rel_err", "status")

_CAPTIONS = {
    "roofline": "Each point is one ok row; solid roofs are the ceilings measured on the machine, "
                "dashed ones the datasheet figures; circles mark the ridge points.",
    "phase_comparison": "Latency and percentage of the measured roofline per implementation, "
                        "prefill against decode; a bar is the median.",
    "tokens_per_second": "Prompt tokens/s (batch·q_len / latency) against generated tokens/s "
                         "(batch / latency) for the same model preset: the prefill/decode gap.",
    "prefill_scaling": "Prefill latency and TFLOP/s as the sequence grows.",
    "decode_scaling": "Decode bandwidth as the KV cache grows, against the measured peak.",
    "speedup": "Speedup over the baseline implementation on identical cases of one device, mode and timer.",
    "linear_sweep": "Each projection's achieved TFLOP/s, GB/s and latency against M under the measured roofs as "
                    "functions of M; the dash-dot line is the M where the intensity reaches the measured ridge, "
                    "the dotted one on the latency panel the time to read the weights once at the measured GB/s.",
    "layer_tokens_per_second": "M / (qkv + o + gate_up + down latency): tokens per second through one decoder "
                               "layer's projections, at the M values where all four were measured.",
}
_PHASE_CAPTIONS = {
    "phases_ttft": "Time to first token of one prompt (layers x the layer at M = prompt tokens, then the head) and "
                   "prompt tokens/s = prompt / TTFT.",
    "phases_decode": "Time per output token and output tokens/s = batch / TPOT against the decode batch; the dashed "
                     "line is the batch where throughput stops growing. Right: tokens/s each user sees, against "
                     "3 and 10 tok/s.",
    "phases_chunk": "Chunked prefill (Sarathi-Serve): one point per chunk size, the prompt's TTFT against the mean "
                    "inter-token latency of the decode users it shares steps with; the lines are the unchunked TTFT "
                    "and the decode-only step.",
    "phases_breakdown": "Where a decode step's time goes, by part; on the reference decoder's layer count, the "
                        "hatched top is what its measured step takes beyond the composition (launch gaps and the "
                        "rest), drawn only when positive.",
}
_LEFT_OUT = ("Interpreter-mode rows (correctness only) and noisy rows (timed while the device was "
             "contended) are left out of every figure; each figure's title counts them.")

_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1250px; margin: 2em auto; color: #222; }
table { border-collapse: collapse; font-size: 13px; margin-bottom: 1.5em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #f2f2f2; }
img { max-width: 100%; border: 1px solid #eee; }
.note { color: #666; font-size: 13px; }
"""


def _sort_rows(table: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Operators, phases and impls in their usual order rather than alphabetical."""
    keys = {}
    if "op" in by:
        keys["op"] = {name: index for index, name in enumerate(ordered_ops(table["op"].unique()))}
    if "phase" in by:
        keys["phase"] = {name: index for index, name in enumerate(ordered_phases(table["phase"].unique()))}
    if "impl" in by:
        keys["impl"] = {name: index for index, name in enumerate(ordered_impls(table["impl"].unique()))}
    return table.sort_values(
        by, key=lambda column: column.map(keys[column.name]) if column.name in keys else column
    ).reset_index(drop=True)


def summary_table(df: pd.DataFrame, by=SUMMARY_BY) -> pd.DataFrame:
    """Per group of ok rows (device, mode, timer, profiled, op, phase and impl by default): the
    ok count, how many of them are noisy, and best and median pct_roofline, median TFLOP/s
    and GB/s over the ok rows that are not noisy. Interpreter-mode rows are not performance
    and never enter it (see correctness_table)."""
    by = [name for name in by if name in df.columns]
    ok = ok_rows(df)
    ok = ok[~interpreter(ok)]
    if ok.empty:
        return pd.DataFrame(columns=by + list(SUMMARY_COLUMNS))
    clean = performance_rows(ok).groupby(by, dropna=False, observed=True)
    table = pd.DataFrame({"ok": ok.groupby(by, dropna=False, observed=True).size()})
    noisy = ok["noisy"].fillna(False).astype(bool) if "noisy" in ok.columns else pd.Series(False, index=ok.index)
    table["noisy"] = noisy.groupby([ok[name] for name in by], dropna=False, observed=True).sum()
    table["best_pct_roofline"] = clean["pct_roofline"].max()
    table["median_pct_roofline"] = clean["pct_roofline"].median()
    table["median_tflops"] = clean["tflops"].median()
    table["median_gbps"] = clean["gbps"].median()
    table["noisy"] = table["noisy"].fillna(0).astype(int)
    return _sort_rows(table.reset_index(), by)


def correctness_table(df: pd.DataFrame) -> pd.DataFrame:
    """The interpreter-mode rows (Triton without a GPU): what they prove is correctness, so
    per row the device, impl, case, max_rel_err against the reference and status."""
    rows = df[interpreter(df)]
    if rows.empty:
        return pd.DataFrame(columns=list(CORRECTNESS_COLUMNS))
    table = rows.assign(case=[_case_text(row) for row in rows.to_dict("records")])
    table = _sort_rows(table, [name for name in ("device", "op", "phase", "impl", "batch", "q_len", "kv_len", "m")
                               if name in table.columns])
    return table[list(CORRECTNESS_COLUMNS)]


def _case_text(row: dict) -> str:
    if row.get("op") == "linear":
        return f"linear {row['phase']} {row.get('projection') or ''} m{row['m']} n{row['n']} k{row['k']} " \
               f"{row['dtype']}".replace("  ", " ")
    text = (f"{row.get('op') or 'attention'} {row['phase']} b{row['batch']} hq{row['q_heads']} "
            f"hkv{row['kv_heads']} q{row['q_len']} k{row['kv_len']} d{row['head_dim']} {row['dtype']}")
    if row.get("causal") is True:
        text += " causal"
    if row.get("seqlens"):
        text += f" seqlens={row['seqlens']}"
    return text


def status_table(df: pd.DataFrame, by=STATUS_BY) -> pd.DataFrame:
    """Per group: how many rows are ok, skipped, failed and incorrect (and any other status)."""
    by = [name for name in by if name in df.columns]
    statuses = list(STATUSES) + sorted(set(df["status"]) - set(STATUSES)) if not df.empty else list(STATUSES)
    if df.empty:
        return pd.DataFrame(columns=by + statuses + ["total"])
    counts = df.groupby(by + ["status"], dropna=False, observed=True).size().unstack("status", fill_value=0)
    counts = counts.reindex(columns=statuses, fill_value=0)
    counts.columns.name = None
    counts["total"] = counts.sum(axis=1)
    return _sort_rows(counts.reset_index(), by)


def profiled(df: pd.DataFrame) -> pd.Series:
    """Rows measured under a profiler (`phasebench profile`): their timings carry its overhead."""
    if "profiled" not in df.columns:
        return pd.Series(False, index=df.index)
    return df["profiled"].fillna(False).astype(bool)


def report_rows(df: pd.DataFrame, *, include_profiled: bool = False) -> pd.DataFrame:
    """The rows a report is made of: all of them, less the profiled ones unless asked for."""
    return df if include_profiled else df[~profiled(df)]


def problems_table(df: pd.DataFrame, limit: int = 40) -> pd.DataFrame:
    """The reasons rows are not ok, most frequent first."""
    by = [name for name in ("status", "op", "impl", "phase", "reason") if name in df.columns]
    columns = by + ["rows"]
    bad = df[df["status"] != "ok"]
    if bad.empty:
        return pd.DataFrame(columns=columns)
    counts = bad.groupby(by, dropna=False).size().rename("rows")
    return counts.reset_index().sort_values("rows", ascending=False, kind="stable").head(limit)[columns]


def runs_table(df: pd.DataFrame) -> pd.DataFrame:
    """One line per (run_id, device): kind, row counts, earliest row time, versions, profiled or not."""
    columns = ["run_id", "device", "device_kind", "rows", "ok", "first_row", "torch_version", "triton_version",
               "profiled"]
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
    table["profiled"] = profiled(df).groupby([df["run_id"], df["device"]], dropna=False).any()
    return table.reset_index()[columns]


def figures(df: pd.DataFrame, *, datasheet: dict | None = None, baseline: str = "naive") -> dict:
    """Every report figure by name (a name is also the PNG's file stem): the attention figures
    when the frame holds attention rows, the linear ones when it holds linear rows."""
    found = {"roofline": roofline(df, datasheet=datasheet)}
    if has_op(df, "attention") or not has_op(df, "linear"):
        found.update({
            "phase_comparison": phase_comparison(df),
            "tokens_per_second": tokens_per_second(df),
            "prefill_scaling": prefill_scaling(df),
            "decode_scaling": decode_scaling(df),
        })
    found["speedup"] = speedup(df, baseline=baseline)
    if has_op(df, "linear"):
        found["linear_sweep"] = linear_sweep(df)
        found["layer_tokens_per_second"] = layer_tokens_per_second(df)
    return found


def has_op(df: pd.DataFrame, op: str) -> bool:
    return not op_rows(df, op).empty


def write_report(
    df: pd.DataFrame,
    out_dir,
    *,
    title: str = "phasebench report",
    datasheet: dict | None = None,
    baseline: str = "naive",
    dpi: int = 110,
    include_profiled: bool = False,
    phases: dict | None = None,
    comparison: pd.DataFrame | None = None,
) -> dict[str, Path]:
    """Write every figure as NAME.png, summary.csv and a self-contained report.html into
    out_dir (created if needed). Returns {figure name | "summary" | "html": path}.

    Rows measured under a profiler are left out (the page says how many) unless
    include_profiled; they then form groups of their own. `phases` (load_phases of a
    `phasebench phases` folder) adds a Phases section: its tables and phases_ttft.png,
    phases_decode.png, phases_chunk.png and phases_breakdown.png. `comparison` (a frame of
    analysis.compare.compare) adds a Comparison section, comparison.png and comparison.csv."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    left_out = 0 if include_profiled else int(profiled(df).sum())
    df = report_rows(df, include_profiled=include_profiled)
    paths: dict[str, Path] = {}
    embedded: dict[str, str] = {}
    for name, fig in figures(df, datasheet=datasheet, baseline=baseline).items():
        paths[name], embedded[name] = _save(fig, out / f"{name}.png", dpi)
    phase_pngs: dict[str, str] = {}
    for name, draw in (PHASE_FIGURES.items() if phases is not None else ()):
        paths[name], phase_pngs[name] = _save(draw(phases), out / f"{name}.png", dpi)
    compared = _comparison_section(comparison, out, dpi, paths)

    def png(name, fig):  # the paged section's figure, saved beside the others
        paths[name], encoded = _save(fig, out / f"{name}.png", dpi)
        return encoded
    paged = paged_section(df, png, _table_html)

    summary = summary_table(df)
    paths["summary"] = out / "summary.csv"
    summary.to_csv(paths["summary"], index=False)

    paths["html"] = out / "report.html"
    page = _html(df, title, summary, embedded, left_out, _phases_section(phases, phase_pngs), compared, paged)
    paths["html"].write_text(page, encoding="utf-8")
    return paths


def _save(fig, path: Path, dpi: int) -> tuple[Path, str]:
    """Write a figure as PNG; return the path and the PNG in base64 for the page."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    png = buffer.getvalue()
    path.write_bytes(png)
    return path, base64.b64encode(png).decode("ascii")


def _phases_section(phases: dict | None, embedded: dict[str, str]) -> list[str]:
    """The Phases section: what the composition of the measured ops gives for a whole model, and its figures."""
    if phases is None:
        return []
    meta = phases.get("meta") or {}
    model = meta.get("model") or {}
    setting = ", ".join(f"{key} {meta[key]}" for key in ("device", "dtype") if meta.get(key))
    parts = [
        '<h2 id="phases">Phases: the whole model composed from the measured ops</h2>',
        f'<p class="note">Model {html.escape(str(model.get("name", "?")))} ({model.get("layers", "?")} layers)'
        f'{", " + html.escape(setting) if setting else ""}. Each step is the sum of count x median latency of the '
        "measured cases it runs (<code>phasebench phases</code>); the last table checks the sum against a real "
        "forward pass.</p>",
    ]
    for name, heading in (("prefill", "Prefill: TTFT per prompt"), ("decode", "Decode: the batch sweep"),
                          ("chunked", "Chunked prefill"), ("interactive", "Interactive limits")):
        if phases.get(name) is not None:
            parts += [f"<h3>{heading}</h3>", _table_html(phases[name])]
    parts += ["<h3>The composition against a real forward pass</h3>",
              '<p class="note">error_pct = 100 (composed - reference) / reference; negative: the composition is '
              "faster, by what it leaves out.</p>", _table_html(reference_table(phases))]
    for name, encoded in embedded.items():
        heading = name.replace("_", " ")
        parts += [
            f'<h3 id="{name}">{html.escape(heading)}</h3>',
            f'<p class="note">{html.escape(_PHASE_CAPTIONS[name])}</p>',
            f'<img alt="{html.escape(heading)}" src="data:image/png;base64,{encoded}">',
        ]
    return parts


def _comparison_section(comparison: pd.DataFrame | None, out: Path, dpi: int, paths: dict) -> list[str]:
    """The Comparison section (analysis.compare): comparison.png and comparison.csv beside the page, its tables."""
    if comparison is None:
        return []
    from .compare_output import comparison_figure, comparison_note, comparison_tables

    paths["comparison"], encoded = _save(comparison_figure(comparison), out / "comparison.png", dpi)
    paths["comparison_csv"] = out / "comparison.csv"
    comparison.to_csv(paths["comparison_csv"], index=False)
    parts = ['<h2 id="comparison">Comparison: new against base</h2>',
             f'<p class="note">{html.escape(comparison_note(comparison))}</p>']
    for heading, table in comparison_tables(comparison).items():
        parts += [f"<h3>{html.escape(heading)}</h3>", _table_html(table)]
    return parts + [f'<img alt="comparison" src="data:image/png;base64,{encoded}">']


def _table_html(table: pd.DataFrame) -> str:
    if table.empty:
        return '<p class="note">(none)</p>'
    return table.to_html(index=False, border=0, na_rep="–", float_format=_format_number, escape=True)


def _format_number(value: float) -> str:
    if not np.isfinite(value):
        return "–"
    return f"{value:.1f}" if abs(value) >= 1 else f"{value:.3g}"


def _linear_section(df: pd.DataFrame) -> list[str]:
    """The crossings table, only for a frame with linear rows."""
    if not has_op(df, "linear"):
        return []
    return [
        '<h2 id="linear">Linear layers: where decode turns compute-bound</h2>',
        '<p class="note">Per projection and implementation: the measured ridge (peak TFLOP/s · 1000 / peak GB/s, '
        "FLOP/B), the M at which this N, K reaches it (crossing_m, from 2·M·N·K / (elem·(M·K + N·K + M·N))), the M "
        "range measured and whether its ends are memory- and compute-bound. The achieved figures at the smallest "
        "and largest M, and the latency against the weight-streaming floor (elem·N·K bytes at the measured GB/s; "
        "floor_pct = 100 · floor / latency), are over the rows that are not noisy; interpreter-mode rows take no "
        "part. See the linear sweep figure below.</p>",
        _table_html(linear_crossings(df)),
    ]


def _html(df: pd.DataFrame, title: str, summary: pd.DataFrame, embedded: dict[str, str], left_out: int,
          phases_section: list[str] = (), comparison_section: list[str] = (), paged_section: list[str] = ()) -> str:
    runs = runs_table(df)
    profiled_note = (f" {left_out} rows measured under a profiler are left out "
                     "(<code>--include-profiled</code> keeps them)." if left_out else "")
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="note">Generated {stamp} from {len(df)} rows in {len(runs)} run(s). '
        "Percentages are against the roofline measured on the machine that ran the row; "
        f"rows of different devices, modes and timers are never pooled.{profiled_note}</p>",
        "<h2>Runs</h2>", _table_html(runs),
        "<h2>Summary by device, mode, timer, operator, phase and implementation</h2>",
        '<p class="note">Per group of ok rows (interpreter-mode rows are in the correctness table): '
        "how many, how many were noisy, and over the ones that were not, best and median % of the "
        "measured roofline, median TFLOP/s and GB/s.</p>",
        _table_html(summary),
        "<h2>Correctness of interpreter-mode rows</h2>",
        '<p class="note">Triton in its interpreter proves correctness; its timings are not performance.</p>',
        _table_html(correctness_table(df)),
        "<h2>Status</h2>", _table_html(status_table(df)),
        "<h2>Rows that are not ok</h2>", _table_html(problems_table(df)),
        *_linear_section(df),
        *paged_section,
        *phases_section,
        *comparison_section,
        "<h2>Figures</h2>",
        f'<p class="note">{html.escape(_LEFT_OUT)}</p>',
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
