"""phasebench.bench.instruments: what a measurement reads with: timers (timing, and cuda_events: the events and the
L2 flush of a GPU), the correctness gate (gate), the ceilings measured here (roofline, ceiling_measures) and at the
moments of a run (ceiling_drift), cold operands (cold), host and GPU conditions (conditions), the contention probe
(contention) and what the machine reads now (readings/), and memory/ (host caches, free device memory, poisoned
allocations).
Imports bench.spec and phasebench.profiles (NVTX ranges) only."""
