"""phasebench.kernels.elementwise: the memory-bound work of a decoder layer beside attention and the projections
(norms, adds, activations, RoPE, the KV-cache append, the greedy pick) behind one calling convention: the request
and its validation, and the eager torch implementation. Imports only the shared helpers of phasebench.kernels."""

from . import eager, request  # noqa: F401  (request declares the operator; eager registers)

# isort: off
from . import compiled  # noqa: F401  (registered after eager: listed last)
# isort: on
