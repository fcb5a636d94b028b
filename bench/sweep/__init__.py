"""phasebench.bench.sweep: the one measuring path (measure) and the sweeps around it: the runner and its store
(runner, results, metadata), a run's rounds (rounds), the worker process that measures where a crash costs one row
(worker) and the run's device work here or there (executor), what a run selects (selection), suites as data
(suites), a sweep spread over devices (spread: shards and Ray) and a run's terminal output (console). Imports
phasebench.kernels, phasebench.profiles, bench.spec, bench.instruments and bench.ops."""
