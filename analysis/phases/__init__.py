"""The phase model and a `phasebench phases` folder: the composition (model), the folder read back (folder), its
figures and summary (figures), and which remedy keeps the decode users above their targets (remedies)."""
