"""phasebench.analysis: load result rows and draw roofline and phase figures (data only, no torch)."""

from ..bench.spec.schema import RESULT_COLUMNS, RUN_COLUMNS, SCHEMA_VERSION
from .compare import compare, regressions, with_samples
from .compare_output import comparison_figure
from .interference import interference_summary, load_interference
from .interference_plots import stretch_figure, user_rate_figure, write_interference_figures
from .linear_plots import layer_tokens_per_second, layer_tokens_per_second_table, linear_crossings, linear_sweep
from .load import DataFileError, load, load_profile
from .paged_plots import paged_figure, paged_table
from .phase_plots import phase_comparison, tokens_per_second
from .phases import (
    chunk_figure,
    decode_breakdown_figure,
    decode_figure,
    phases_summary,
    reference_table,
    ttft_figure,
    write_phase_figures,
)
from .phases_folder import load_phases
from .report import (
    Headline,
    correctness_table,
    headline,
    read_sources,
    report_rows,
    status_table,
    summary_table,
    write_report,
)
from .roofline_plot import roofline
from .scaling_plots import decode_scaling, prefill_scaling
from .speedup import speedup, speedup_table

__all__ = [
    "DataFileError",
    "Headline",
    "RESULT_COLUMNS",
    "RUN_COLUMNS",
    "SCHEMA_VERSION",
    "chunk_figure",
    "compare",
    "comparison_figure",
    "correctness_table",
    "decode_breakdown_figure",
    "decode_figure",
    "decode_scaling",
    "headline",
    "interference_summary",
    "layer_tokens_per_second",
    "layer_tokens_per_second_table",
    "linear_crossings",
    "linear_sweep",
    "load",
    "load_interference",
    "load_phases",
    "load_profile",
    "paged_figure",
    "paged_table",
    "phase_comparison",
    "phases_summary",
    "write_phase_figures",
    "prefill_scaling",
    "read_sources",
    "reference_table",
    "regressions",
    "report_rows",
    "roofline",
    "speedup",
    "speedup_table",
    "status_table",
    "stretch_figure",
    "summary_table",
    "tokens_per_second",
    "ttft_figure",
    "user_rate_figure",
    "write_interference_figures",
    "write_report",
    "with_samples",
]
