"""phasebench.bench.instruments.readings: what the machine says now, for the contention probe: the host's CPU time,
schedstat waits and runnable tasks (host_reading), a GPU's processes, clocks and throttle reasons (gpu_reading)."""
