"""NVTX annotation, profile capture (nsys or torch.profiler) and parsers of profiles into pandas."""
