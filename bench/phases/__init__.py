"""phasebench.bench.phases: the phase model's measuring side: `phasebench phases` measures what a decoder's steps
run and composes them (run_phases, with analysis.phase_model), checked against a plain-PyTorch decoder
(reference_decoder); `phasebench interference` times that decoder's decode step alone, beside a prefill co-runner
(corunner: a second process or CUDA stream) and protected from it (interference). Imports bench.sweep and below,
and analysis.phase_model (torch-free)."""
