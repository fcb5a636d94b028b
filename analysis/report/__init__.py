"""The report: the answer first (the headline), figures, then tables; one self-contained HTML page and its PNGs.

headline (the answer as a frame, markdown or HTML), tables (summary, ceilings, status, correctness, flagged rows),
sources (the kinds of paths a report reads), context and sections (the page as a list of sections), page
(write_report)."""

from .context import Context, Section
from .headline_table import Headline, headline
from .page import figures, write_report
from .sections import HEADLINE_BLOCKS, SECTIONS
from .sources import KINDS, Kind, Sources, comparison_of, read_sources
from .tables import (
    above_roof_rows,
    ceilings_table,
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
    "ceilings_table",
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
