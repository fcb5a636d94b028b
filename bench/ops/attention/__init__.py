"""The attention operator: cases (dense, ragged) and their sweeps, the cost model, inputs and the float64
reference, the low-precision baseline and the memory charge; record.py registers them as one record."""
