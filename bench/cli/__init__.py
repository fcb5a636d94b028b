"""phasebench.bench.cli: the `phasebench` command line: the verbs (main), the sweep verbs beyond one process
(sweeps), the result verbs (results) and the session verbs (session). The one place that wires bench, kernels,
profiles and analysis together; each verb imports its module only when it runs."""

import time

STARTED = time.monotonic()  # a verb's --time-budget counts from here: the imports and the ceilings are in it

from .main import main  # noqa: E402  (after STARTED, which the verbs import)

__all__ = ["main"]
