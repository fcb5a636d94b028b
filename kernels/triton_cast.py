"""The Triton kernels' store-side cast: fp32 to the output dtype, rounded to nearest even in the interpreter too."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def cast_out(acc, dtype: tl.constexpr, UPCAST: tl.constexpr):
    """acc (fp32) in the output dtype, rounded to nearest even in the interpreter too."""
    if UPCAST and dtype == tl.bfloat16:
        # the interpreter truncates fp32 -> bf16 where a GPU rounds to nearest even (its own RTNE path drops the
        # carry into the exponent): round the bits first so the truncation is exact; NaN stays NaN (the carry
        # could turn it into a zero)
        bits = acc.to(tl.uint32, bitcast=True)
        bits += 0x7FFF + ((bits >> 16) & 1)
        rounded = ((bits >> 16) << 16).to(tl.float32, bitcast=True)
        acc = tl.where(acc != acc, acc, rounded)
    return acc.to(dtype)
