"""Cases, cost model, timers, measured roofline, runner, CLI and the pytest-benchmark suite."""
