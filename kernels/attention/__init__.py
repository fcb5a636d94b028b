"""phasebench.kernels.attention: attention behind one calling convention (BHSD, GQA, bottom-right causal,
ragged caches): the request and its validation, naive, FlashAttention (flash_attn or SDPA), FlexAttention (compiled
by Inductor) and the project's Triton kernels (tiled prefill, split-KV decode). Imports only the shared helpers of
phasebench.kernels."""

from . import flash, naive, request  # noqa: F401  (request declares the operator; the rest register)

# isort: off
from . import flex  # noqa: F401  (registered after the others: listed last)
# isort: on

try:
    from . import triton_attention  # noqa: F401
except ImportError as err:  # no triton on this platform: the other implementations still work
    TRITON_IMPORT_ERROR: str | None = str(err)
else:
    TRITON_IMPORT_ERROR = None
