"""phasebench.bench.sweep: the one measuring path (measure) and the sweeps around it: the runner and its store
(runner, results, metadata), the worker process that measures where a crash costs one row (worker), what a run
selects (selection), suites as data (suites), shards and Ray (shards, ray_runner) and a run's terminal output
(console). Imports phasebench.kernels, phasebench.profiles, bench.spec, bench.instruments and bench.ops."""
