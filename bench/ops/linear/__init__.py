"""The linear operator: cases over a model's projections, their sweeps and the cost model (cases.py), the seeded
inputs (inputs.py), the float64 reference (reference.py), the low-precision baseline (baseline.py) and the memory
charge (memory.py); record.py registers them as one record."""
