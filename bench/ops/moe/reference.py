"""The higher-precision reference of a routed-experts case, written from the definition, not from any impl: for each
touched expert, its tokens' gate, up and down products in the reference dtype (fp64 on every device), SiLU(gate) *
up, each output scaled by its routing weight and added to its token's row; packed experts unpacked from their
documented layouts by the quantized linear gate's own unpack (never the kernels' dequantize). The low-precision
baseline (baseline.py) runs the same arithmetic in fp32 with the case dtype's rounding points (unpacked weights
rounded to the dtype, as a kernel that dequantizes to it multiplies them)."""

from __future__ import annotations

import torch

from ..linear.reference import REFERENCE_BYTES, reference_dtype
from ..qlinear.unpack import unpack
from .cases import MoeCase
from .inputs import MoeInputs


def _rounded(t: torch.Tensor, rounding: torch.dtype | None) -> torch.Tensor:
    """t rounded to `rounding` and back (a value a kernel writes in that dtype); unchanged without one."""
    return t if rounding is None else t.to(rounding).to(t.dtype)


def expert_matrix(stack, expert: int, device: torch.device, dtype: torch.dtype,
                  rounding: torch.dtype | None = None) -> torch.Tensor:
    """Expert `expert` of a float stack in `dtype`, or of a packed one unpacked in fp64 (rounded to `rounding`)."""
    if isinstance(stack, torch.Tensor):
        return stack[expert].to(device=device, dtype=dtype)
    return _rounded(unpack(stack.expert(expert)).to(device), rounding).to(dtype)


def expert_mixture(case: MoeCase, inputs: MoeInputs, device: torch.device, dtype: torch.dtype,
                   rounding: torch.dtype | None = None) -> torch.Tensor:
    """sum_j w[t, j] * W_down[e] (SiLU(W_gate[e] x_t) * W_up[e] x_t) over each token t's experts e = ids[t, j], the
    operands upcast to `dtype` (TF32 off). With `rounding`, what a kernel in that dtype writes is rounded to it: the
    gate and up outputs, their activated product, each weighted expert output and the sum (the result is in
    `rounding`); a bounded block of a touched expert's tokens at a time."""
    ids = inputs.topk_ids.to(device=device, dtype=torch.int64)
    weights = inputs.topk_weights.to(device=device, dtype=dtype)
    x = inputs.x.to(device)
    out = torch.zeros((case.m, case.k), dtype=dtype, device=device)
    rows = max(1, REFERENCE_BYTES // (max(case.k, 2 * case.n) * dtype.itemsize))
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for expert in torch.unique(ids).tolist():
            w_gate_up = expert_matrix(inputs.w_gate_up, expert, device, dtype, rounding)
            w_down = expert_matrix(inputs.w_down, expert, device, dtype, rounding)
            tokens, slots = (ids == expert).nonzero(as_tuple=True)
            for start in range(0, tokens.numel(), rows):
                t, j = tokens[start:start + rows], slots[start:start + rows]
                gate_up = _rounded(x[t].to(dtype) @ w_gate_up.T, rounding)
                gate, up = gate_up[:, :case.n], gate_up[:, case.n:]
                act = _rounded(gate * torch.sigmoid(gate) * up, rounding)
                y = _rounded((act @ w_down.T) * weights[t, j, None], rounding)
                out.index_add_(0, t, y)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    return out if rounding is None else out.to(rounding)


def reference(case: MoeCase, inputs: MoeInputs, device: torch.device) -> torch.Tensor:
    """The case's output in higher precision (fp64 on every device)."""
    return expert_mixture(case, inputs, device, reference_dtype(device))
