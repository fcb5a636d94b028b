"""phasebench.bench.session: the GPU session: `phasebench selfcheck` (selfcheck, its plan as data, its steps), the
wheels a machine without an index needs (wheels), sm_90 builds checked without a GPU (hopper_build), the program
Nsight Compute profiles (ncu_target), cross-checks against independent tools (crosscheck) and child processes
under a wall-clock allowance (child_process). Imports
bench.sweep and below, phasebench.profiles and phasebench.analysis."""
