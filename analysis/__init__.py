"""phasebench.analysis: load result rows and draw roofline and phase figures (data only, no torch)."""

from .load import DataFileError, load, load_profile
from .phase_plots import phase_comparison, tokens_per_second
from .report import status_table, summary_table, write_report
from .roofline_plot import roofline
from .scaling_plots import decode_scaling, prefill_scaling
from .schema import RESULT_COLUMNS, RUN_COLUMNS, SCHEMA_VERSION
from .speedup import speedup, speedup_table

__all__ = [
    "DataFileError",
    "RESULT_COLUMNS",
    "RUN_COLUMNS",
    "SCHEMA_VERSION",
    "decode_scaling",
    "load",
    "load_profile",
    "phase_comparison",
    "prefill_scaling",
    "roofline",
    "speedup",
    "speedup_table",
    "status_table",
    "summary_table",
    "tokens_per_second",
    "write_report",
]
