"""phasebench.bench.ops: one package per operator (attention/, linear/, elementwise/), each holding its case type
and sweeps, cost model, inputs (inputs.py), reference (reference.py), low-precision baseline (baseline.py) and
memory charge (memory.py), and its record (record.py);
records.py holds the record type and the registry, which imports the built-in records on first use. Imports
phasebench.kernels, phasebench.profiles (NVTX names), bench.spec and bench.instruments; never the sweep, the
CLI or the session."""

from .records import Operator, operator_of, operators, register_operator

__all__ = ["Operator", "operator_of", "operators", "register_operator"]
