"""The figure kit (kit: rows, groups, colours, markers, Agg figures) and the figures of result rows: roofline,
prefill against decode, scaling, speedup, linear layers, quantized linear layers, paged KV caches."""
