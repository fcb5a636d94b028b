"""phasebench.bench.cli: the `phasebench` command line: the verbs (main), the sweep verbs beyond one process
(sweeps), the result verbs (results) and the session verbs (session). The one place that wires bench, kernels,
profiles and analysis together; each verb imports its module only when it runs."""

from .main import main

__all__ = ["main"]
