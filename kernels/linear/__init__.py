"""phasebench.kernels.linear: the linear layer x [M, K] times w [N, K] behind one calling convention: the
request and its validation, naive (no BLAS), the vendor BLAS (torch) and the project's Triton split-K GEMV and
tiled GEMM. Imports only the shared helpers of phasebench.kernels."""

from . import naive, request, vendor  # noqa: F401  (request declares the operator; the rest register)

# isort: off
from . import compiled  # noqa: F401  (registered after the others: listed last)
# isort: on

try:
    from . import triton_linear  # noqa: F401
except ImportError as err:  # no triton on this platform: the other implementations still work
    TRITON_IMPORT_ERROR: str | None = str(err)
else:
    TRITON_IMPORT_ERROR = None
