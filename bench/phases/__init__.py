"""phasebench.bench.phases: the phase model's measuring side. `phasebench phases` measures what a decoder's steps
run and composes them (run_phases, with analysis.phases.model; op_cases names each op's case), checked against
real forward passes of the same dims at 0, L and 2L layers (reference_check: timed in brackets interleaved with
rounds of the ops; analysis.phases.check computes the errors) of a plain-PyTorch decoder (reference_decoder) and
of transformers' Llama (hf_reference);
the decoder's hybrid iteration (hybrid_step: decode tokens and a prompt's chunk in one forward), which
`phasebench interference` (the interference package) times as a prompt arrives, beside its spatial sharing modes.
Imports bench.sweep and below, and analysis.phases (torch-free)."""
