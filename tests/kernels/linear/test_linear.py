"""The linear facade: naive and torch against a float64 reference at awkward sizes, and its bad-input rules."""

from __future__ import annotations

import pytest
import torch
from phasebench.kernels import Unsupported, available_impls, linear, prepare_linear, register
from phasebench.kernels.registry import OPS

from ...markers import tiered

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
SIZES = [(1, 97, 4095), (3, 4097, 200), (17, 64, 33), (70, 130, 1000)]


def draw(m, n, k, dtype, device, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(dtype=dtype, device=device)
    w = torch.randn(n, k, generator=gen).div_(k ** 0.5).to(dtype=dtype, device=device)
    return x, w


def rel_err(out, ref):
    return ((out.double() - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("impl", tiered(["naive", "torch", "compiled"]))
@pytest.mark.parametrize("m,n,k", SIZES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_matches_float64_reference(device, impl, m, n, k, dtype):
    x, w = draw(m, n, k, dtype, device, seed=m * 131 + n)
    out = linear(x, w, impl=impl)
    assert out.shape == (m, n) and out.dtype == dtype and out.device == x.device
    ref = x.double() @ w.double().T
    if dtype == torch.float32:
        assert rel_err(out, ref) <= 1e-4
    else:  # at most twice the error of the vendor math in that dtype (rounding of the output dominates)
        assert rel_err(out, ref) <= 2 * rel_err(torch.nn.functional.linear(x, w), ref) + 1e-5


def test_backends_are_named():
    x, w = draw(2, 8, 16, torch.float32, "cpu", 1)
    assert prepare_linear(x, w, impl="naive").backend == "elementwise-sum"
    assert prepare_linear(x, w, impl="torch").backend
    assert {"naive", "torch"} <= set(available_impls("cpu", op="linear"))


@pytest.mark.parametrize("args,message", [
    ((torch.randn(3, 4), torch.randn(5, 6)), "w: must be \\[N, K\\] with K = x's 4"),
    ((torch.randn(3, 4, 1), torch.randn(5, 4)), "x: must have rank 2"),
    ((torch.randn(4, 3).T, torch.randn(5, 4)), "x: its last dimension must be contiguous"),
    ((torch.randn(3, 4), torch.randn(5, 4, dtype=torch.float64)), "w: dtype must match x"),
    ((torch.randn(3, 4).int(), torch.randn(5, 4).int()), "x: must be a floating dtype"),
    ((torch.randn(0, 4), torch.randn(5, 4)), "x: must not have an empty dimension"),
])
def test_bad_input_is_one_line(args, message):
    with pytest.raises(ValueError, match=message) as info:
        linear(*args, impl="torch")
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="impl: unknown implementation 'fastest' of linear"):
        linear(torch.randn(2, 3), torch.randn(4, 3), impl="fastest")


def test_a_linear_plugin_registers_and_may_refuse():
    def even_only(x, w):
        if x.shape[0] % 2:
            raise Unsupported("odd M")
        return torch.nn.functional.linear(x, w)

    register("linear", "even_only", even_only, devices=("cpu", "cuda"), dtypes=("float32",))
    try:
        x, w = draw(4, 8, 16, torch.float32, "cpu", 2)
        assert torch.equal(linear(x, w, impl="even_only"), torch.nn.functional.linear(x, w))
        with pytest.raises(Unsupported, match="odd M"):
            linear(x[:3], w, impl="even_only")
        with pytest.raises(Unsupported, match="does not support dtype"):
            linear(x.double(), w.double(), impl="even_only")
        with pytest.raises(ValueError, match="'torch' is a built-in linear implementation"):
            register("linear", "torch", even_only)
    finally:
        OPS["linear"].pop("even_only", None)
