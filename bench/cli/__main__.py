"""`python -m phasebench.bench.cli`: the command line, as the `phasebench` script runs it."""

import sys

from .main import main

sys.exit(main())
