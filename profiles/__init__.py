"""Profiling support: NVTX ranges (nvtx_ranges), case-key names, nsys / torch.profiler parsers and a summary."""
