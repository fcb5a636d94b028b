"""phasebench.kernels.moe: routed mixture-of-experts layers, x [M, K] through each token's top-k experts
(w_gate_up [E, 2N, K], w_down [E, K, N], vLLM's fused_moe layout): the request and the router's top-k (request.py),
the slots sorted by expert (sorting.py), naive (a loop over experts), torch._grouped_mm and the project's fused
Triton kernels. Imports only phasebench.kernels' helpers."""

from . import naive, request, vendor  # noqa: F401  (request declares the operator; the rest register)

# isort: off
from . import compiled  # noqa: F401  (registered after the others: listed last)
# isort: on
from .request import MoeRequest, route, validate_moe  # noqa: F401

try:
    from . import triton_moe  # noqa: F401
except ImportError as err:  # no triton on this platform: the other implementations still work
    TRITON_IMPORT_ERROR: str | None = str(err)
else:
    TRITON_IMPORT_ERROR = None
