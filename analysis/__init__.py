"""phasebench.analysis: result rows read back, drawn and reported (data only, no torch). By topic: loading (run
folders, results files, pytest-benchmark JSON), figures (the kit and the figures of result rows), phases (the phase
model, a `phasebench phases` folder and its figures), interference, comparison and report; the notebooks and the
committed sample/ sit beside them. The names below are the public API."""

from ..bench.spec.schema import RESULT_COLUMNS, RUN_COLUMNS, SCHEMA_VERSION
from .comparison.display import comparison_figure
from .comparison.pairs import compare, regressions, with_samples
from .figures.linear import layer_tokens_per_second, layer_tokens_per_second_table, linear_crossings, linear_sweep
from .figures.moe import moe_coverage, moe_coverage_table
from .figures.paged import paged_figure, paged_table
from .figures.prefill_decode import phase_comparison, tokens_per_second
from .figures.quantized import quant_speedup, quant_speedup_table
from .figures.roofline import decode_kinds_roofline, decode_kinds_table, roofline
from .figures.scaling import decode_scaling, prefill_scaling
from .figures.speedup import speedup, speedup_table
from .interference.figures import stretch_figure, user_rate_figure, write_interference_figures
from .interference.rows import interference_summary, load_interference
from .loading.results import DataFileError, load, load_profile
from .phases.figures import (
    chunk_figure,
    decode_breakdown_figure,
    decode_figure,
    phases_summary,
    reference_table,
    ttft_figure,
    write_phase_figures,
)
from .phases.folder import load_phases
from .phases.speculative_figures import best_gamma_figure, speculative_figure, speculative_summary
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

__all__ = [
    "DataFileError",
    "Headline",
    "best_gamma_figure",
    "RESULT_COLUMNS",
    "RUN_COLUMNS",
    "SCHEMA_VERSION",
    "chunk_figure",
    "compare",
    "comparison_figure",
    "correctness_table",
    "decode_breakdown_figure",
    "decode_kinds_roofline",
    "decode_kinds_table",
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
    "moe_coverage",
    "moe_coverage_table",
    "paged_figure",
    "quant_speedup",
    "quant_speedup_table",
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
    "speculative_figure",
    "speculative_summary",
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
