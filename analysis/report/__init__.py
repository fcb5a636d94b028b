"""The report: the answer first (the headline), figures, then tables; one self-contained HTML page and its PNGs.

headline_table (the answer computed) and headline_text (the Headline, in markdown or HTML), tables (summary,
status, correctness, flagged rows), sources (the kinds of paths a report reads), performance_figures (the figures of
the rows), context (what a section is given and returns) and sections (the page as a list of sections, with
interference_section and paged_section), page (write_report: the sections in order, one HTML page)."""

from .context import Context, Section
from .headline_table import headline
from .headline_text import Headline
from .page import write_report
from .performance_figures import figures
from .sections import HEADLINE_BLOCKS, SECTIONS
from .sources import KINDS, Kind, Sources, comparison_of, read_sources
from .tables import (
    above_roof_rows,
    correctness_table,
    noisy_rows,
    not_ok_rows,
    problems_table,
    profiled,
    report_rows,
    runs_table,
    status_table,
    summary_table,
)

__all__ = [
    "HEADLINE_BLOCKS",
    "KINDS",
    "SECTIONS",
    "Context",
    "Headline",
    "Kind",
    "Section",
    "Sources",
    "above_roof_rows",
    "comparison_of",
    "correctness_table",
    "figures",
    "headline",
    "noisy_rows",
    "not_ok_rows",
    "problems_table",
    "profiled",
    "read_sources",
    "report_rows",
    "runs_table",
    "status_table",
    "summary_table",
    "write_report",
]
