"""phasebench.kernels.mla: MLA decode (DeepSeek-V2/V3) over a latent KV cache, contiguous or paged: the request,
naive (the attention module's math over the latent), torch (SDPA), flex (FlexAttention) and the project's split-KV
Triton kernel. Imports only phasebench.kernels' helpers and the attention package (its masks, gathers, SDPA routes,
flex planning and reduce kernel)."""

from . import naive, request, sdpa  # noqa: F401  (request declares the operator; the rest register)

# isort: off
from . import flex  # noqa: F401  (registered after the others: listed last)
# isort: on

try:
    from . import triton_mla  # noqa: F401
except ImportError as err:  # no triton on this platform: the other implementations still work
    TRITON_IMPORT_ERROR: str | None = str(err)
else:
    TRITON_IMPORT_ERROR = None
