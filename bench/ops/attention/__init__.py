"""The attention operator: cases (dense, ragged, paged) and their sweeps, the cost model, inputs (a paged case's
pools and block table in pages.py) and the float64 reference, the low-precision baseline and the memory charge;
record.py registers them as one record."""
