"""phasebench.bench.spec: what bench and analysis both need, with no torch: the result schema (schema), the
decoder model presets (models: dense, mixture-of-experts, MLA and sliding-window), the step
definitions of prefill, decode and the hybrid chunked step (steps), and a results folder's writes (files: whole rows,
torn rows set aside, files renamed into place; folder_lock: one writer per folder). A leaf: imports nothing else of
phasebench."""
