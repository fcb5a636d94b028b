"""The phase model and a `phasebench phases` folder: the composition (model), its check against real forward passes
(check: the published, interleaved and per-layer errors and the goal), the folder read back (folder), its figures
and summary (figures), and which remedy keeps the decode users above their targets (remedies)."""
