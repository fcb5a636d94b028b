"""phasebench.bench.spec: what bench and analysis both need, with no torch: the result schema (schema), the
decoder model presets (models), the attention of MLA and sliding-window models (attention_presets) and the step
definitions of prefill, decode and the hybrid chunked step (steps).
A leaf: imports nothing else of phasebench."""
