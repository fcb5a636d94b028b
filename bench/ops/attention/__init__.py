"""The attention operator: cases (dense, ragged, paged) and their sweeps (cases.py), the cost model (cost.py), the
seeded and large-logit inputs (inputs.py; a paged case's pools and block table in pages.py), the float64 reference
(reference.py), the low-precision baseline (baseline.py) and the memory charge (memory.py); record.py registers
them as one record."""
