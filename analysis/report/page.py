"""The top of the report: write_report runs SECTIONS in order into one self-contained report.html (beside the
PNGs and summary.csv the sections write), with its title line, navigation and style."""

from __future__ import annotations

import html
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from ...bench.spec.store.files import write_file
from ...bench.spec.store.folder_lock import holding
from .context import Context, Section
from .sections import SECTIONS
from .tables import profiled, report_rows, runs_table

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #222; background: #fff; }
main { max-width: 1500px; margin: 0 auto; padding: 10px 24px 48px; }
h1 { font-size: 1.45em; margin: 0.2em 0 0.1em; }
h2 { font-size: 1.2em; margin: 0.9em 0 0.3em; border-bottom: 1px solid #ddd; padding-bottom: 2px; }
h3 { font-size: 1.02em; margin: 0.8em 0 0.3em; }
nav { font-size: 13px; margin: 2px 0 6px; } nav a { margin-right: 0.9em; white-space: nowrap; }
a { color: #1f5fbf; }
.note { color: #555; font-size: 13px; margin: 0.2em 0 0.5em; }
.over-goal { color: #a40000; }
section { margin-top: 18px; min-width: 0; }
.lead { display: grid; gap: 8px 28px; margin-top: 4px; }
.lead h2 { margin-top: 0.2em; }
@media (min-width: 1180px) {
  .lead { grid-template-columns: minmax(0, 5fr) minmax(0, 3fr); align-items: start; }
  .lead > figure { position: sticky; top: 6px; margin-top: 6px; }
}
.answer { min-width: 0; }
.hl-block { border-left: 4px solid #4a7bd0; background: #f6f8fc; padding: 2px 10px 4px; margin: 0 0 10px; }
.hl-block h3 { margin: 3px 0 2px; }
.hl-block p { margin: 2px 0; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #d4d4d4; padding: 2px 7px; white-space: nowrap; text-align: left; vertical-align: top; }
th { background: #eef0f3; } thead th { white-space: normal; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.long { white-space: normal; min-width: 16em; max-width: 42em; }
table.hl { background: #fff; } table.hl td:nth-child(n+6) { white-space: normal; }
.scroll { overflow-x: auto; max-width: 100%; margin: 4px 0 8px; }
figure { margin: 0 0 14px; min-width: 0; }
figure img { display: block; max-width: 100%; height: auto; border: 1px solid #e6e6e6; }
figcaption { color: #555; font-size: 13px; margin-top: 3px; }
.figures { display: grid; gap: 14px 24px; grid-template-columns: repeat(auto-fill, minmax(min(100%, 600px), 1fr)); }
.figures > .wide { grid-column: 1 / -1; }
details { margin: 6px 0 10px; } summary { cursor: pointer; font-weight: 600; }
"""


def write_report(
    df: pd.DataFrame,
    out_dir,
    *,
    title: str = "phasebench report",
    datasheet: dict | None = None,
    baseline: str = "naive",
    dpi: int = 110,
    include_profiled: bool = False,
    phases: dict | list | None = None,
    comparison: pd.DataFrame | None = None,
    found: dict[str, list] | None = None,
    sections=None,
) -> dict[str, Path]:
    """Write every figure as NAME.png, summary.csv and a self-contained report.html into out_dir (created if
    needed). Returns {figure name | "summary" | "html" | ...: path}.

    The page is SECTIONS (analysis.report.sections) in order, or `sections`: the headline beside the roofline,
    the figures, then the tables. Rows measured under a profiler are left out (the page says how many) unless
    include_profiled; they then form groups of their own. `phases` (load_phases of a `phasebench phases` folder,
    or a list of them) adds the phases to the headline, their figures and a Phases section; `found` gives what
    sources of other kinds hold ({kind: [...]}, as analysis.report.sources.Sources.found reads them);
    `comparison` (a frame of analysis.comparison.pairs.compare) adds a Comparison section, comparison.png and
    comparison.csv."""
    out = Path(out_dir)
    kinds = {kind: list(values) for kind, values in (found or {}).items()}
    if phases is not None:
        kinds["phases"] = [phases] if isinstance(phases, dict) else list(phases)
    ctx = Context(df=report_rows(df, include_profiled=include_profiled), out=out, found=kinds,
                  comparison=comparison, datasheet=datasheet, baseline=baseline, dpi=dpi,
                  left_out=0 if include_profiled else int(profiled(df).sum()))
    with holding(out):  # one writer per folder; every file renamed into place whole
        made = [section for make in (SECTIONS if sections is None else sections) if (section := make(ctx)) is not None]
        ctx.paths["html"] = out / "report.html"
        write_file(ctx.paths["html"], page_html(ctx, title, made))
    return ctx.paths


def page_html(ctx: Context, title: str, sections: list[Section]) -> str:
    """The page: a title line, the navigation, then the sections in order."""
    runs = runs_table(ctx.df)
    phases = len(ctx.of("phases"))
    profiled_note = (f" {ctx.left_out} rows measured under a profiler are left out "
                     "(<code>--include-profiled</code> keeps them)." if ctx.left_out else "")
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    nav = " ".join(f'<a href="#{section.id}">{html.escape(section.title.split(":")[0])}</a>' for section in sections)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body><main>",
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="note">Generated {stamp} from {len(ctx.df)} rows in {len(runs)} run(s)'
        f'{f" and {phases} phases folder(s)" if phases else ""}. Percentages are against the roofline measured on '
        f"the machine that ran the row; rows of different devices, modes and timers are never pooled."
        f"{profiled_note}</p>",
        f"<nav>{nav}</nav>",
    ]
    for section in sections:
        css = f' class="{section.css}"' if section.css else ""
        heading = f"<h2>{html.escape(section.title)}</h2>" if section.heading else ""
        parts += [f'<section id="{section.id}"{css}>{heading}', *section.body, "</section>"]
    parts.append("</main></body></html>")
    return "\n".join(parts) + "\n"
