"""Inputs, the float64/float32 reference, the low-precision baseline, the planned call and the memory charge of an
elementwise case; tuple and index outputs reach the gate through a view of them (gate.Viewed), outside the timing."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ....kernels import prepare_elementwise
from ....kernels.elementwise.request import OPTIONS
from ...instruments.device_memory import CHECK_COPIES, UNKNOWN_INPUT_COPIES, fit_reason
from ...instruments.gate import Viewed, relative_error
from ...instruments.roofline import TORCH_DTYPES
from ..linear.cases import ELEMENT_BYTES
from .cases import ElementwiseCase, tensor_elements

EPS = OPTIONS["rmsnorm"]["eps"]
BASE = OPTIONS["rotary"]["base"]
REFERENCE_TEMPS = 3  # the reference's upcast inputs and its intermediates, in input-sized buffers
# fp32 temporaries of the eager torch math, in multiples of the output (rmsnorm's fp32 x and its square, ...)
TORCH_TEMPS = {"rmsnorm": 3, "residual_add": 0, "silu_mul": 1, "rotary": 4, "kv_append": 0, "greedy_pick": 0}


@dataclass(frozen=True)
class ElementwiseInputs:
    """The kind's tensors in its calling order; kv_append also keeps the caches' rows at the positions as drawn."""

    tensors: tuple
    saved: tuple = ()


def make_inputs(case: ElementwiseCase, device: torch.device, seed: int = 0) -> ElementwiseInputs:
    """Standard-normal tensors from a fixed seed (the rmsnorm weight about 1), positions the last m of cache_len."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = TORCH_DTYPES[case.dtype]

    def draw(*shape):
        return torch.randn(shape, generator=gen, device=device, dtype=dtype)

    m, n, d = case.m, case.n, case.head_dim
    positions = torch.arange(case.positions_start, case.positions_start + m, device=device)
    if case.kind == "rmsnorm":
        return ElementwiseInputs((draw(m, n), draw(n).add_(1)))
    if case.kind == "residual_add":
        return ElementwiseInputs((draw(m, n), draw(m, n)))
    if case.kind == "silu_mul":
        return ElementwiseInputs((draw(m, 2 * n),))
    if case.kind == "rotary":
        return ElementwiseInputs((draw(m, n, d), draw(m, case.kv_heads, d), positions))
    if case.kind == "kv_append":
        cache_k, cache_v = draw(case.cache_len, n, d), draw(case.cache_len, n, d)
        saved = (cache_k[positions].clone(), cache_v[positions].clone())
        return ElementwiseInputs((cache_k, cache_v, draw(m, n, d), draw(m, n, d), positions), saved)
    return ElementwiseInputs((draw(m, n),))


def reference_dtype(device: torch.device) -> torch.dtype:
    return torch.float64 if device.type == "cpu" else torch.float32


def _what(out) -> str:
    return type(out).__name__ if not isinstance(out, torch.Tensor) else f"a {out.dtype} tensor {tuple(out.shape)}"


def _pair(out, names: tuple[str, str], likes: tuple) -> None:
    """Raise a one-line ValueError unless `out` is two tensors shaped and typed like `likes`."""
    if not isinstance(out, (tuple, list)) or len(out) != 2 or not all(isinstance(t, torch.Tensor) for t in out):
        raise ValueError(f"output must be a pair of tensors ({', '.join(names)}), got {_what(out)}")
    for name, t, like in zip(names, out, likes, strict=True):
        if t.shape != like.shape or t.dtype != like.dtype:
            raise ValueError(f"output {name} is {_what(t)}, expected a {like.dtype} tensor {tuple(like.shape)}")


def _rotary_view(q, k):
    def view(out):
        _pair(out, ("q", "k"), (q, k))
        return torch.cat((out[0].flatten(), out[1].flatten()))
    return view


def _kv_view(cache_k, cache_v, positions):
    def view(out):
        _pair(out, ("cache_k", "cache_v"), (cache_k, cache_v))
        if out[0].data_ptr() != cache_k.data_ptr() or out[1].data_ptr() != cache_v.data_ptr():
            raise ValueError("kv_append must write the caches in place and return them")
        return torch.cat((out[0].index_select(0, positions).flatten(), out[1].index_select(0, positions).flatten()))
    return view


def _pick_view(logits):
    def view(out):
        m, vocab = logits.shape
        if not isinstance(out, torch.Tensor) or out.dtype != torch.int64 or tuple(out.shape) != (m,):
            raise ValueError(f"output must be int64 token ids [{m}], got {_what(out)}")
        if out.min().item() < 0 or out.max().item() >= vocab:
            raise ValueError(f"output token ids must lie in [0, {vocab}), got {out.min().item()}..{out.max().item()}")
        return logits.gather(1, out[:, None]).squeeze(1)  # a right pick has the row's largest logit; ties are fine
    return view


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def reference(case: ElementwiseCase, inputs: ElementwiseInputs, device: torch.device):
    """The kind's math in float64 on the host, float32 on a GPU; a gate.Viewed for tuple and index outputs."""
    r = reference_dtype(device)
    t = inputs.tensors
    if case.kind == "rmsnorm":
        x, w = t[0].to(r), t[1].to(r)
        return x / torch.sqrt((x * x).sum(dim=1, keepdim=True) / case.n + EPS) * w
    if case.kind == "residual_add":
        return t[0].to(r) + t[1].to(r)
    if case.kind == "silu_mul":
        gate, up = t[0][:, :case.n].to(r), t[0][:, case.n:].to(r)
        return gate / (1 + torch.exp(-gate)) * up
    if case.kind == "rotary":
        # the angles as the convention makes them: fp32 positions times fp32 frequencies, one fp32 rounding
        freq = (1.0 / torch.pow(BASE, torch.arange(0, case.head_dim, 2, dtype=torch.float64) / case.head_dim))
        angles = (t[2].to(torch.float32)[:, None] * freq.to(device=device, dtype=torch.float32)[None, :]).to(r)
        cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
        rotated = (_rotate(t[0].to(r), cos, sin), _rotate(t[1].to(r), cos, sin))
        return Viewed(torch.cat([x.flatten() for x in rotated]), _rotary_view(t[0], t[1]))
    if case.kind == "kv_append":
        return Viewed(torch.cat((t[2].flatten(), t[3].flatten())).to(r), _kv_view(t[0], t[1], t[4]))
    return Viewed(t[0].amax(dim=1).to(r), _pick_view(t[0]))  # a max is exact in any dtype


def baseline_error(case: ElementwiseCase, inputs: ElementwiseInputs, ref) -> float | None:
    """The error of the eager torch math in the case's dtype (None in fp32: a fixed limit).

    kv_append copies, which rounds nothing: its baseline is 0 without running it (a run here would write the
    very rows the check of each impl looks for)."""
    if case.dtype == "float32":
        return None
    if case.kind == "kv_append":
        return 0.0
    out = prepare_elementwise(case.kind, *inputs.tensors, impl="torch").run()
    tensor, view = (ref.tensor, ref.view) if isinstance(ref, Viewed) else (ref, lambda o: o)
    return relative_error(view(out), tensor)


def prepare(case: ElementwiseCase, inputs: ElementwiseInputs, impl: str):
    """The planned call of one impl; kv_append first puts back the rows as drawn, so that an impl that writes
    nothing fails its check instead of passing on what the previous impl wrote."""
    if case.kind == "kv_append":
        cache_k, cache_v, _, _, positions = inputs.tensors
        cache_k.index_copy_(0, positions, inputs.saved[0])
        cache_v.index_copy_(0, positions, inputs.saved[1])
    return prepare_elementwise(case.kind, *inputs.tensors, impl=impl)


def _int_bytes(case: ElementwiseCase) -> int:
    return 8 * case.m if case.kind in ("rotary", "kv_append") else 0  # int64 positions


def case_bytes(case: ElementwiseCase, device: torch.device) -> int:
    """The inputs as allocated (kv_append: the whole caches and the saved rows), the reference and its temporaries."""
    elem, ref = ELEMENT_BYTES[case.dtype], reference_dtype(device).itemsize
    read, written = tensor_elements(case)
    allocated = read + (2 * case.cache_len * case.n * case.head_dim + written if case.kind == "kv_append" else 0)
    ref_out = case.m if case.kind == "greedy_pick" else written
    scratch = 0 if case.kind == "greedy_pick" else REFERENCE_TEMPS * read
    return elem * allocated + _int_bytes(case) + ref * (ref_out + scratch)


def impl_bytes(case: ElementwiseCase, impl: str, device: torch.device) -> int:
    """The impl's output and scratch (a plugin: UNKNOWN_INPUT_COPIES x the inputs), the gate's view and copies."""
    elem, ref = ELEMENT_BYTES[case.dtype], reference_dtype(device).itemsize
    read, written = tensor_elements(case)
    output = 8 * case.m if case.kind == "greedy_pick" else (0 if case.kind == "kv_append" else elem * written)
    if impl == "torch":
        scratch = 4 * TORCH_TEMPS[case.kind] * written
    else:
        scratch = UNKNOWN_INPUT_COPIES * (elem * read + _int_bytes(case))
    viewed = elem * (case.m if case.kind == "greedy_pick" else written)
    return output + scratch + viewed + CHECK_COPIES * ref * (case.m if case.kind == "greedy_pick" else written)


def does_not_fit(case: ElementwiseCase, impl: str, device: torch.device, *, resident: bool = False,
                 free: int | None = None) -> str | None:
    note = "" if impl == "torch" else f"; {impl} is charged its output plus {UNKNOWN_INPUT_COPIES}x the inputs"
    return fit_reason(impl, impl_bytes(case, impl, device), case_bytes(case, device), device,
                      resident=resident, free=free, note=note)
