"""phasebench.bench.phases.interference: `phasebench interference`. The hybrid form (run_hybrid: a prompt's arrival
in the decode users' iterations, whole or chunked, through the reference decoder's hybrid_step) and spatial sharing
(run_interference: the decode step alone, beside a prefill co-runner, corunner: a second process or CUDA stream, and
protected from it); rows builds both forms' rows. Imports bench.phases' decoder, bench.sweep and below."""

from .run_interference import HOST_MODEL, InterferenceConfig, run_interference

__all__ = ["HOST_MODEL", "InterferenceConfig", "run_interference"]
