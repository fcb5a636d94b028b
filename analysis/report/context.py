"""What a report section is given (Context: the rows, the sources by kind, where files go) and what it returns
(Section), with the helpers that write a figure or a folded table into the page."""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ..figures.kit import save_png
from .performance_figures import figures

FOLD_OVER = 12  # a table of more rows starts folded
WIDE_INCHES = 10.0  # a figure at least this wide takes the page's whole width
LONG_TEXT = 40  # a text cell longer than this wraps instead of widening its column
MANY_COLUMNS = 10  # a wider table says its text columns of one value once, above it, to fit the page


@dataclass
class Section:
    """One part of the page: its id (the anchor the navigation and links use), its title and its HTML.
    `css` adds classes to the <section>; `heading` False leaves the title out of the page (the nav keeps it)."""

    id: str
    title: str
    body: list[str]
    css: str = ""
    heading: bool = True


@dataclass
class Context:
    """What every section may read: `df` the rows shown (profiled ones left out unless asked), `found` what the
    sources of each kind hold (analysis.report.sources: {kind: [what its read returned, ...]}), `comparison` a
    frame of analysis.comparison's compare or None, `out` the folder, and `paths` every file written so far by name."""

    df: pd.DataFrame
    out: Path
    found: dict[str, list] = field(default_factory=dict)
    comparison: pd.DataFrame | None = None
    datasheet: dict | None = None
    baseline: str = "naive"
    dpi: int = 110
    left_out: int = 0
    paths: dict[str, Path] = field(default_factory=dict)
    _figures: dict | None = None

    def of(self, kind: str) -> list:
        return list(self.found.get(kind, []))

    def performance_figures(self) -> dict:
        """The figures of the rows (performance_figures.figures), drawn once for every section that shows one."""
        if self._figures is None:
            self._figures = figures(self.df, datasheet=self.datasheet, baseline=self.baseline)
        return self._figures

    def figure(self, name: str, fig, caption: str = "", *, wide: bool | None = None) -> str:
        """Write `fig` as NAME.png (kept in `paths`) and return it as an embedded <figure> with its caption;
        a figure of WIDE_INCHES or more spans the page's width in a grid of figures."""
        self.paths[name] = self.out / f"{name}.png"
        png = save_png(fig, self.paths[name], self.dpi)
        wide = fig.get_size_inches()[0] >= WIDE_INCHES if wide is None else wide
        heading = name.replace("_", " ")
        text = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
        encoded = base64.b64encode(png).decode("ascii")
        css = ' class="wide"' if wide else ""
        return (f'<figure id="{name}"{css}>'
                f'<img alt="{html.escape(heading)}" src="data:image/png;base64,{encoded}">{text}</figure>')


def figure_grid(parts: list[str]) -> str:
    return '<div class="figures">' + "".join(parts) + "</div>" if parts else ""


def folded(title: str, table: pd.DataFrame, *, anchor: str | None = None, note: str = "",
           fold_over: int = FOLD_OVER) -> str:
    """A table under a <details> whose summary line gives the title and the row count; open when it holds
    fold_over rows or fewer; a line saying "none" for an empty one. Wide tables scroll inside their box."""
    rows = len(table)
    ident = f' id="{anchor}"' if anchor else ""
    if not rows:
        return f'<p{ident} class="empty"><b>{html.escape(title)}</b>: none.</p>'
    opened = " open" if rows <= fold_over else ""
    text = f'<p class="note">{html.escape(note)}</p>' if note else ""
    count = f"{rows} row{'s' if rows != 1 else ''}"
    return (f"<details{ident}{opened}><summary>{html.escape(title)} ({count})</summary>{text}"
            f"{table_html(table)}</details>")


def table_html(table: pd.DataFrame) -> str:
    """A frame as an HTML table in a box that scrolls sideways: numbers right-aligned and rounded, long text
    wrapping, column names breaking after underscores, every cell escaped. A table of more than MANY_COLUMNS
    columns and two rows or more names its text columns that hold one value in every row once, above it."""
    if table.empty:
        return '<p class="note">(none)</p>'
    same = _one_value_columns(table) if len(table.columns) > MANY_COLUMNS and len(table) > 1 else []
    common = ""
    if same:
        said = " · ".join(f"{html.escape(str(name))} <b>{html.escape(_text(table[name].iloc[0]))}</b>"
                          for name in same)
        common = f'<p class="note">In every row: {said}</p>'
        table = table.drop(columns=same)
    head = "".join(f"<th>{_breakable(str(name))}</th>" for name in table.columns)
    body = []
    for row in table.itertuples(index=False):
        body.append("<tr>" + "".join(_cell(value) for value in row) + "</tr>")
    return (f'{common}<div class="scroll"><table><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def _one_value_columns(table: pd.DataFrame) -> list:
    """The columns of text or yes/no that hold one value, the same in every row (never all of them)."""
    same = [name for name in table.columns
            if not pd.api.types.is_numeric_dtype(table[name]) or pd.api.types.is_bool_dtype(table[name])
            if table[name].astype(str).nunique(dropna=False) == 1]
    return same if len(same) < len(table.columns) else []


def _missing(value) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and not np.isfinite(value))


def _text(value) -> str:
    """A one-value column's value as its cells would show it."""
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    return "–" if _missing(value) else str(value)


def _breakable(name: str) -> str:
    """A column name that may wrap after each underscore, so a table of long names fits the page's width."""
    return html.escape(name).replace("_", "_<wbr>")


def _cell(value) -> str:
    if _missing(value):
        return '<td class="num">–</td>'
    if isinstance(value, (bool, np.bool_)):
        return f"<td>{'yes' if value else 'no'}</td>"
    if isinstance(value, (int, np.integer)):
        return f'<td class="num">{int(value)}</td>'
    if isinstance(value, (float, np.floating)):
        return f'<td class="num">{format_number(float(value))}</td>'
    text = str(value)
    return f'<td class="long">{html.escape(text)}</td>' if len(text) > LONG_TEXT else f"<td>{html.escape(text)}</td>"


def format_number(value: float) -> str:
    if not np.isfinite(value):
        return "–"
    if float(value).is_integer() and abs(value) < 1e6:
        return str(int(value))
    return f"{value:.1f}" if abs(value) >= 1 else f"{value:.3g}"
