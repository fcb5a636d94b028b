"""phasebench.bench.cli: the `phasebench` command line. main builds the parser and holds list, run, profile and
ceilings; each other module holds its verbs with their parsers: sweeps (run --shard / --ray, merge), results
(report, compare), phases_verb, interference_verb and session (env, selfcheck, wheels); options holds what several
verbs share (the case selection, isolation, option checks). The one place that wires bench, kernels, profiles and
analysis together; each verb imports what it runs only when it runs."""

import time

STARTED = time.monotonic()  # a verb's --time-budget counts from here: the imports and the ceilings are in it

from .main import main  # noqa: E402  (after STARTED, which the verbs import)

__all__ = ["main"]
