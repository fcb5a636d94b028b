"""phasebench.bench.sweep: the one measuring path (measure) and the sweeps around it: the runner and its store
(runner, results, metadata), what a command line selects (selection), suites as data (suites), shards and Ray
(shards, ray_runner), budgeted child processes (child_process) and a run's terminal output (console).
Imports phasebench.kernels, phasebench.profiles, bench.spec, bench.instruments and bench.ops."""
