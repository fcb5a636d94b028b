"""The elementwise operator (norms, adds, activations, RoPE, KV append, greedy pick): cases and their cost model
(cases.py), the seeded inputs and kv_append's poisoned rows (inputs.py), the reference and its views (reference.py),
the low-precision baseline (baseline.py) and the memory charge (memory.py); record.py registers them."""
