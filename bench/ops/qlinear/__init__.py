"""The quantized linear operator (qlinear): cases over a model's projections per scheme, their sweeps and cost model
(cases.py), the seeded inputs with their packed weights (inputs.py), the float64 reference of the dequantized weights
(reference.py), the low-precision baseline (baseline.py) and the memory charge (memory.py); record.py registers
them as one record."""
