"""phasebench.bench.instruments: what a measurement reads with: timers (timing), the correctness gate (gate), the
ceilings measured here (roofline), host and GPU conditions (conditions, gpu_reading), the contention probe
(contention) and free device memory (device_memory). Imports bench.spec and phasebench.profiles (NVTX ranges) only."""
