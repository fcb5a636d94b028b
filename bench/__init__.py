"""phasebench.bench: everything that measures. Sub-packages by concept, each importing only those listed before it:

spec/         the torch-free spec shared with analysis: result schema, model presets, step definitions
instruments/  timers, the correctness gate, measured ceilings, host and GPU conditions, contention, device memory
ops/          one package per operator: case type, cost, inputs, reference, baseline, memory charge, its record
sweep/        the one measuring path, the runner and its store, the measuring worker, suites, selection, shards, Ray
phases/       the phase model's measuring side: `phasebench phases`, the reference decoder, `phasebench interference`
session/      the GPU session: self-check, wheels, Hopper builds, the ncu target, cross-checks, child processes
cli/          the `phasebench` command line, the one place that wires bench, kernels, profiles and analysis

The pytest-benchmark suite (conftest.py, bench_params.py, test_kernels_bench.py) stays here for `pytest bench`;
cases.py and cost.py keep the attention contract names of docs/design.md. Importing this package loads no torch.
"""
