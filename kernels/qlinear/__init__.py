"""phasebench.kernels.qlinear: weight-only quantized linear layers, x [M, K] times a packed weight [N, K]: the
schemes and their packed layouts (schemes.py), the request, naive (dequantize then F.linear), torch's weight-only
GEMMs and the project's fused-dequantize Triton kernels. Imports only phasebench.kernels' helpers and linear's
Triton reduce."""

from . import naive, request, vendor  # noqa: F401  (request declares the operator; the rest register)

# isort: off
from . import compiled  # noqa: F401  (registered after the others: listed last)
# isort: on
from .schemes import SCHEMES, QuantizedWeight, quantize  # noqa: F401

try:
    from . import triton_qlinear  # noqa: F401
except ImportError as err:  # no triton on this platform: the other implementations still work
    TRITON_IMPORT_ERROR: str | None = str(err)
else:
    TRITON_IMPORT_ERROR = None
