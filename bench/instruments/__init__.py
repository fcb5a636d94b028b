"""phasebench.bench.instruments: what a measurement reads with: timers (timing), the correctness gate (gate), the
ceilings measured here (roofline, ceiling_measures), cold operands (cold), host and GPU conditions (conditions,
gpu_reading), the contention probe (contention), and memory/ (host caches, free device memory, poisoned allocations).
Imports bench.spec and phasebench.profiles (NVTX ranges) only."""
