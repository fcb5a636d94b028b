"""The elementwise operator (norms, adds, activations, RoPE, KV append, greedy pick): cases and their cost
model, inputs and the reference, the baseline, the planned call and the memory charge; record.py registers them."""
