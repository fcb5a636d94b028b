"""The routed-experts operator (moe): cases over a mixture-of-experts layer per routing, their sweeps and cost model
with the touched experts (cases.py), the seeded inputs with their routing (inputs.py), the float64 reference
(reference.py), the low-precision baseline (baseline.py) and the memory charge (memory.py); record.py registers them
as one record."""
